"""The speedrun's records in gpu_check.json as markdown tables: what a device call prints last
(the device tool's reply carries the end of the output) and what docs/gpu.md's results are
written from.

    python scripts/gpu_report.py build/gc/gpu_check.json

Per speedrun attempt: seed, the flags added to the recipe, exit status (0 finished, 130 stopped
by its time box, 75 not started), wall seconds of the whole command, epochs done, when it first
reached 90/93/94%, top-1 single view and with flip TTA, how many runs shared the GPU (at once: 1
alone, more side by side, each then timed as it shared it); then the mean top-1 over the
finished seeds of each set of flags; then the pipeline benchmark's rows (with each row's first
epoch, which compiles and captures, its last loss and which graphs held); then the flags
VIT_GPU_SPEEDRUN_ARGS=auto took from them. A file holding none of those records, or one without
a field the tables read, is one line naming the file and the field, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

NAME_CHARS = 60  # CUDA kernels' names run to hundreds of characters (templates)
SECTIONS = ("environment", "speedrun", "pipeline", "speedrun_choice")
# the fields the tables read, where the record is there
ATTEMPT_FIELDS = ("seed", "status", "wall_seconds", "epochs", "top1", "tta_top1")
ROW_FIELDS = ("config", "shape", "images_per_s", "ms_per_step", "data_wait_share")
FAILED_ROW_FIELDS = ("config", "shape", "error")
CHOICE_FIELDS = ("row", "flags", "expected_epochs", "together")
# the fields the tables format as numbers: (field, whether null is accepted: an empty cell)
ATTEMPT_NUMBERS = (("wall_seconds", False), ("top1", True), ("tta_top1", True))
ROW_NUMBERS = (
    ("images_per_s", False), ("ms_per_step", False), ("data_wait_share", False),
    ("gpu_busy_share", True), ("warm_up_seconds", True), ("train_loss", True),
)  # fmt: skip
CHOICE_NUMBERS = (("gpu_busy_share", True),)


def percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}%"


def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.0f} s"


def loss(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def captured_text(captured: dict) -> str:
    """Which of the row's graphs held ('step yes, update refused'); none asked for (or a
    CPU): empty."""
    held = {True: "yes", False: "refused"}
    return ", ".join(f"{name} {held[value]}" for name, value in captured.items() if value in held)


def flags_text(run: dict) -> str:
    """The flags an attempt added to the recipe, as one string."""
    return " ".join(run.get("flags", [])) or "(the recipe)"


def speedrun_table(attempts: list[dict]) -> list[str]:
    lines = [
        "| seed | flags | status | wall | epochs | 90% at | 93% at | 94% at | top-1 | TTA "
        "| at once |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in attempts:
        reached = run.get("first_reached_s", {})
        lines.append(
            f"| {run['seed']} | {flags_text(run)} "
            f"| {run['status']} | {seconds(run['wall_seconds'])} "
            f"| {run['epochs'][-1]['epoch'] if run['epochs'] else 0} "
            f"| {seconds(reached.get('90'))} | {seconds(reached.get('93'))} "
            f"| {seconds(reached.get('94'))} | {percent(run['top1'])} "
            f"| {percent(run['tta_top1'])} | {run.get('at_once', 1)} |"
        )
    # the finished runs' means, one line per set of flags (the seeds of one variant)
    finished: dict[str, list[dict]] = {}
    for run in attempts:
        if run["status"] == 0 and run["top1"] is not None:
            finished.setdefault(flags_text(run), []).append(run)
    for flags, runs in finished.items():
        tops = [run["top1"] for run in runs]
        walls = [run["wall_seconds"] for run in runs]
        lines.append(
            f"\nFinished runs: {len(runs)}; top-1 mean {percent(statistics.mean(tops))} "
            f"(min {percent(min(tops))}), wall seconds mean {statistics.mean(walls):.0f} "
            f"(max {max(walls):.0f}): {flags}"
        )
    return lines


def pipeline_table(pipeline: dict) -> list[str]:
    environment = pipeline.get("environment", {})
    lines = [
        f"Pipelines on {environment.get('device')}, torch {environment.get('torch')}, "
        f"{environment.get('images')} images an epoch:",
        "| pipeline | model | img/s | ms/step | waiting for data | GPU busy | first epoch "
        "| loss | captured |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in pipeline.get("rows", []):
        if "error" in row:
            lines.append(
                f"| {row['config']} | {row['shape']} | failed: {row['error']} | | | | | | |"
            )
            continue
        busy = row.get("gpu_busy_share")
        lines.append(
            f"| {row['config']} | {row['shape']} | {row['images_per_s']:,.0f} "
            f"| {row['ms_per_step']:.2f} | {100 * row['data_wait_share']:.0f}% "
            f"| {'n/a' if busy is None else f'{100 * busy:.0f}%'} "
            f"| {seconds(row.get('warm_up_seconds'))} | {loss(row.get('train_loss'))} "
            f"| {captured_text(row.get('captured', {}))} |"
        )
    for row in pipeline.get("rows", []):  # where the time went (the profiled epoch)
        for key, what in (("gpu_top_kernels", "GPU by kernel"), ("host_top_ops", "host by op")):
            if row.get(key):
                shares = "; ".join(
                    f"{entry['name'][:NAME_CHARS]} {100 * entry['share']:.1f}%"
                    for entry in row[key]
                )
                lines.append(f"- {row['config']}, {row['shape']}, the epoch's {what}: {shares}")
    return lines


def choice_line(choice: dict) -> str:
    """What VIT_GPU_SPEEDRUN_ARGS=auto took from the pipeline's rows."""
    if choice.get("row") is None:
        return "The speedrun's flags: no row qualified; the recipe as it is."
    busy = choice.get("gpu_busy_share")
    return (
        f"The speedrun's flags, from {choice['row']}: {' '.join(choice['flags']) or '(none)'}; "
        f"~{choice['expected_epochs']} epochs expected; GPU busy "
        f"{'unknown' if busy is None else f'{100 * busy:.0f}%'}: seeds "
        f"{'side by side' if choice['together'] else 'one after the other'}."
    )


def not_a_number(record: dict, fields: tuple[tuple[str, bool], ...]) -> str | None:
    """The first of `fields` in `record` that is not a number (nor null where that is
    accepted), said as: 'top1' is "x", not a number or null; None if all are."""
    for field, nullable in fields:
        value = record.get(field)
        if field not in record or (value is None and nullable):
            continue
        # bool is an int to Python, not a figure to a table
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            accepted = "a number or null" if nullable else "a number"
            return f"'{field}' is {json.dumps(value)}, not {accepted}"
    return None


def missing_field(records: object) -> str | None:
    """What the tables need that `records` lacks ("speedrun[0] has no 'status'", or a field
    that is not the number a table formats), or None."""
    if not isinstance(records, dict) or not any(records.get(key) for key in SECTIONS):
        return f"holds none of {', '.join(SECTIONS)} (not a gpu_check.json)"
    speedrun, pipeline = records.get("speedrun") or [], records.get("pipeline") or {}
    if not isinstance(records.get("environment") or {}, dict):
        return "'environment' is not an object"
    if not isinstance(speedrun, list):
        return "'speedrun' is not a list of attempts"
    if not isinstance(pipeline, dict) or not isinstance(pipeline.get("rows", []), list):
        return "'pipeline' is not an object with a list of 'rows'"
    # (where, the record, the fields it must have, those of them formatted as numbers)
    checks = [
        (f"speedrun[{i}]", run, ATTEMPT_FIELDS, ATTEMPT_NUMBERS) for i, run in enumerate(speedrun)
    ]
    for i, row in enumerate(pipeline.get("rows", [])):
        failed = isinstance(row, dict) and "error" in row
        fields, numbers = (FAILED_ROW_FIELDS, ()) if failed else (ROW_FIELDS, ROW_NUMBERS)
        checks.append((f"pipeline row {i}", row, fields, numbers))
    if choice := records.get("speedrun_choice"):
        chosen = isinstance(choice, dict) and choice.get("row") is not None
        checks.append(("speedrun_choice", choice, CHOICE_FIELDS if chosen else (), CHOICE_NUMBERS))
    for where, record, fields, numbers in checks:
        if not isinstance(record, dict):
            return f"{where} is not an object"
        for field in fields:
            if field not in record:
                return f"{where} has no '{field}'"
        if problem := not_a_number(record, numbers):
            return f"{where}: {problem}"
    for i, run in enumerate(speedrun):
        reached = run.get("first_reached_s") or {}
        if not isinstance(reached, dict):
            return f"speedrun[{i}]: 'first_reached_s' is not an object"
        if problem := not_a_number(reached, tuple((key, True) for key in reached)):
            return f"speedrun[{i}]: 'first_reached_s': {problem}"
    for i, run in enumerate(speedrun):
        epochs = run["epochs"]
        if epochs and not (isinstance(epochs, list) and "epoch" in (epochs[-1] or {})):
            return f"speedrun[{i}]: its 'epochs' are not a list of records with an 'epoch'"
    return None


def report(records: dict) -> str:
    lines = []
    if records.get("environment"):
        env = records["environment"]
        gpu = env.get("gpu") or "no GPU"
        lines.append(f"{gpu}; torch {env.get('torch')}, CUDA {env.get('cuda')}")
    if records.get("speedrun"):
        lines += ["", *speedrun_table(records["speedrun"])]
    if records.get("pipeline"):
        lines += ["", *pipeline_table(records["pipeline"])]
    if records.get("speedrun_choice"):
        lines += ["", choice_line(records["speedrun_choice"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="a gpu_check.json")
    args = parser.parse_args(argv)
    try:
        records = json.loads(args.json.read_text())
    except (OSError, ValueError) as error:
        problem = f"not a readable gpu_check.json ({error})"
        print(f"gpu_report.py: {args.json}: {problem}", file=sys.stderr)
        sys.exit(2)
    if problem := missing_field(records):
        print(f"gpu_report.py: {args.json}: {problem}", file=sys.stderr)
        sys.exit(2)
    print(report(records))


if __name__ == "__main__":
    main()
