"""The speedrun's flags chosen from the pipeline benchmark's rows, as one GPU call needs them:
`scripts/gpu_check.sh`'s speedrun stage with `VIT_GPU_SPEEDRUN_ARGS=auto` measures the rows first,
then trains the seeds with what this prints, in the same call (a device machine kept warm only
30 s between calls leaves no time to read a table and decide by hand).

    python scripts/choose_speedrun_flags.py build/gc/pipeline.json --json build/gc/choice.json

Of the rows that train the recipe (configs/cifar10_gpu_speedrun.yaml, with settings of their own
after a colon, the YAML's model), finished with a finite loss near the others' (LOSS_SPREAD of the
median of three or more of one batch size), it takes the one that trains the most images inside the
recipe's time budget: its images/s times the seconds left once the start (STARTUP_S), its first
epoch's compiling and capturing and, with --distillation-type, its teacher's training are paid. So a
row without compilation wins where its slower step still trains more images in the seconds the
compiler would take, and a larger batch where it buys more images (on the CPU proxy twice the batch
cost 0.19 points at the same epochs, and twice the epochs gained 1.2: docs/speedrun-proxy.md).
The row's settings become train.py flags; at several times the recipe's epochs the evaluations and
checkpoints are spaced out to keep about EVALUATIONS of each a run (0.4 s and 0.2 s each on an
H200), and from MIMETIC_FROM_EPOCHS epochs on the run starts with mimetic initialisation, which
pays with passes (and timm's patch embedding, not the recipe's whitened one: the two together
ended level with mimetic alone), and more augmentation of the images, which pays where the passes
are many. Seeds side by side where the chosen step leaves the GPU idle most of the time (busy
under TOGETHER_BELOW of it), one after the other where it does not: the goal's runs are timed
alone.

Prints two lines: 1 (side by side) or 0 (one after the other), then the flags (an empty line: the
recipe as it is); the reasons and every row's figures on stderr. Exit status 2 when no row
qualifies (the line says why): the caller then trains the recipe as it is; 2 too, with one line
and before any choice, for a file that is not the benchmark's --json (no 'rows', a row without
the fields read here), a --time-budget not above 0, or a --json that cannot be written.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import yaml

from vit.cli.flags import ArgumentParser, key_value, number_in, unwritable
from vit.training.settings import flag_name
from vit.utils.files import atomic_write_text
from vit.utils.ranges import POSITIVE

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "configs/cifar10_gpu_speedrun.yaml"
TRAIN_IMAGES = 50_000  # CIFAR-10's training split: the recipe's epoch
STARTUP_S = 20.0  # imports, decoding and building before the first step (the fifth run: 15-25 s)
EVALUATIONS = 20  # evaluations (and checkpoints) a run, at most, once the epochs grow
TOGETHER_BELOW = 0.35  # the fifth run: busy 22% of a step, two side by side each 7.5% slower
# Mimetic initialisation pays with passes on the CPU proxy (docs/speedrun-proxy.md, two seeds each):
# level with the recipe at 100 epochs (one seed), +0.28 at 134, +1.45 at 200, without a teacher.
# With the recipe's teacher the switch below (mimetic, 3 ops, erasing) paid +1.46 at 134 epochs (two
# seeds: +1.71 and +1.20) and +1.73 at 200 (one seed), so from the fewest epochs it was measured
# paying at, the run starts with it (180 before the teacher's rows). At the recipe's 100 epochs it
# was level, +0.19 (two seeds: +0.47 and -0.09): the fifth run's ~90 epochs stay without.
MIMETIC_FROM_EPOCHS = 134
# ... with timm's patch embedding instead of the recipe's whitened one: on the proxy the two
# together ended level with mimetic alone at 200 epochs (78.40 against 78.64, two seeds each),
# so the run starts as the measured mimetic rows did
MIMETIC = ["--mimetic-init", "--patch-embed-init", "default"]
# ... and with RandAugment's third op and random erasing 0.25: on the proxy, with mimetic, they
# ended +0.78 over 200 epochs (two seeds; behind until epoch 120, ahead from 130) and +0.99 over
# 300 (one seed; behind until 80, ahead from 110), where over 100 epochs without mimetic they were
# level (+0.17 and +0.27 alone, +0.19 together); stochastic depth 0.2 over 300 ended 0.61 behind.
# A run long enough for the initialisation is long enough for them
# With the recipe's teacher the switch pays too: +1.46 at 134 epochs (82.12% against 80.66%, two
# seeds) and +1.73 at 200 (83.41% against 81.68%, one seed) (docs/speedrun-proxy.md)
LONG_RUN_AUGMENTATION = ["--aa-n", "3", "--reprob", "0.25"]
# Rows of one batch size train on the same images from the same seed; they differ in rounding
# (compiled or eager kernels, graphs or not) and at most in which augmentations they draw
# (--augment-batches): ~0.002 apart on the CPU's tiny rows. A loss this far from their median
# is a step that trains otherwise (a graph replaying a stale input, say).
LOSS_SPREAD = 0.1


def setting_flags(settings: str) -> list[str]:
    """'graph_step=true,compile=false,lr=0.0028' -> train.py's flags for those settings."""
    flags = []
    for item in filter(None, settings.split(",")):
        key, value = key_value(item)  # as the benchmark read it
        flag = flag_name(key)
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (int, float, str)):
            flags += [flag, str(value)]
        else:
            raise ValueError(f"{item!r}: a row's setting here takes one value, not {value!r}")
    return flags


def qualifies(row: dict) -> str | None:
    """Why a pipeline row cannot be chosen, or None where it can."""
    path, _, settings = row["config"].partition(":")
    if path != RECIPE:
        return f"not the recipe ({path})"
    try:
        setting_flags(settings)
    except ValueError as error:
        return str(error)
    if row["shape"] != "config":
        return f"another model ({row['shape']})"
    if "error" in row:
        return f"failed: {row['error']}"
    loss = row.get("train_loss")
    if loss is None or not math.isfinite(loss):
        return f"no finite training loss ({loss})"
    return None


def trains_otherwise(candidates: list[dict]) -> dict[int, str]:
    """Why a row trains unlike the others of its batch size (by index in `candidates`), where
    three or more of them give a median to hold it against."""
    outliers = {}
    for batch in {row.get("batch_size") for row in candidates}:
        group = [(i, row) for i, row in enumerate(candidates) if row.get("batch_size") == batch]
        if len(group) < 3:
            continue
        median = statistics.median(row["train_loss"] for _, row in group)
        for i, row in group:
            if abs(row["train_loss"] - median) > LOSS_SPREAD:
                outliers[i] = (
                    f"its loss {row['train_loss']:.3f} is more than {LOSS_SPREAD} from the "
                    f"median {median:.3f} of the rows with its batch: it trains otherwise"
                )
    return outliers


def images_in_budget(row: dict, budget: float) -> float:
    """The training images a run of `row`'s pipeline fits in `budget` seconds: after the start,
    its first epoch, and (--distillation-type) its teacher's training, which the row timed over
    its own images and a run does over all TRAIN_IMAGES."""
    teacher = row.get("teacher_seconds", 0.0) * TRAIN_IMAGES / row.get("train_images", TRAIN_IMAGES)
    training_seconds = budget - STARTUP_S - row.get("warm_up_seconds", 0.0) - teacher
    return row["images_per_s"] * max(0.0, training_seconds)


def spaced_out(recipe: dict, epochs: float) -> list[str]:
    """--eval-interval and --checkpoint-interval at least every `epochs / EVALUATIONS`, in steps
    of the recipe's own interval; none where the recipe's already keeps within EVALUATIONS."""
    flags = []
    for key in ("eval_interval", "checkpoint_interval"):
        own = recipe[key]
        interval = own * math.ceil(epochs / EVALUATIONS / own)
        if interval > own:
            flags += [flag_name(key), str(interval)]
    return flags


def not_rows(pipeline: object) -> str | None:
    """Why `pipeline` is not training_pipeline.py's --json (its 'rows', each a dict with the
    fields choose reads), or None where it is."""
    if not isinstance(pipeline, dict) or not isinstance(pipeline.get("rows"), list):
        return "not a training_pipeline.py --json (no 'rows')"
    for i, row in enumerate(pipeline["rows"]):
        if not isinstance(row, dict):
            return f"row {i} is not an object"
        for field in ("config", "shape"):
            if not isinstance(row.get(field), str):
                return f"row {i} has no '{field}'"
        if "error" in row:
            continue  # a failed row: refused for that
        loss = row.get("train_loss")
        if loss is not None and not isinstance(loss, (int, float)):
            return f"row {i} ({row['config']}): 'train_loss' {loss!r} is not a number"
        if qualifies(row) is None and not isinstance(row.get("images_per_s"), (int, float)):
            return f"row {i} ({row['config']}) has no 'images_per_s'"
    return None


def unwritable_json(path: Path) -> str | None:
    """Why the choice could not be written to `path` (None if it could): checked before the
    choice, so that it is not lost after it. The file is written where it is named: its folder
    must exist."""
    if not path.is_dir() and not path.parent.is_dir():
        return f"--json {path}: no folder {path.parent}; give a file in an existing folder"
    return unwritable("--json", path, folder=False)


def choose(pipeline: dict, recipe: dict) -> dict:
    """The chosen row, its flags and the seeds' way (see the module's docstring)."""
    rows = pipeline.get("rows", [])
    budget = float(recipe["time_budget"])
    candidates, refused = [], []
    for row in rows:
        reason = qualifies(row)
        if reason:
            refused.append({"config": row["config"], "shape": row["shape"], "why": reason})
        else:
            candidates.append(row)
    outliers = trains_otherwise(candidates)
    for i, why in outliers.items():
        refused.append({"config": candidates[i]["config"], "shape": "config", "why": why})
    candidates = [row for i, row in enumerate(candidates) if i not in outliers]
    if not candidates:
        return {"row": None, "refused": refused}
    best = max(candidates, key=lambda row: images_in_budget(row, budget))
    images = images_in_budget(best, budget)
    epochs = images / TRAIN_IMAGES
    busy = best.get("gpu_busy_share")
    _, _, settings = best["config"].partition(":")
    return {
        "row": best["config"],
        "flags": [
            *setting_flags(settings),
            *spaced_out(recipe, epochs),
            *(MIMETIC + LONG_RUN_AUGMENTATION if epochs >= MIMETIC_FROM_EPOCHS else []),
        ],
        "together": busy is not None and busy < TOGETHER_BELOW,
        "time_budget": budget,
        "gpu_busy_share": busy,
        "expected_images": round(images),
        "expected_epochs": round(epochs, 1),
        "candidates": [
            {"config": row["config"], "expected_images": round(images_in_budget(row, budget))}
            for row in candidates
        ],
        "refused": refused,
    }


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", type=Path, help="benchmarks/training_pipeline.py's --json")
    parser.add_argument(
        "--time-budget",
        type=number_in(POSITIVE),
        help="the seeds' budget in seconds, where shorter than the recipe's time_budget",
    )
    parser.add_argument("--json", type=Path, help="also write the choice here")
    args = parser.parse_args(argv)
    if args.json is not None and (problem := unwritable_json(args.json)):
        parser.error(problem)
    try:
        pipeline = json.loads(args.pipeline.read_text())
    except (OSError, ValueError) as error:
        print(f"choose_speedrun_flags.py: {args.pipeline}: unreadable ({error})", file=sys.stderr)
        sys.exit(2)
    if problem := not_rows(pipeline):
        print(f"choose_speedrun_flags.py: {args.pipeline}: {problem}", file=sys.stderr)
        sys.exit(2)
    recipe = yaml.safe_load((ROOT / RECIPE).read_text())
    if args.time_budget is not None:
        recipe["time_budget"] = min(recipe["time_budget"], args.time_budget)
    choice = choose(pipeline, recipe)
    if args.json:
        atomic_write_text(args.json, json.dumps(choice, indent=1))
    for row in choice["refused"]:
        print(f"  not chosen: {row['config']} ({row['shape']}): {row['why']}", file=sys.stderr)
    if choice["row"] is None:
        print(
            f"choose_speedrun_flags.py: {args.pipeline}: no row of {RECIPE} qualifies "
            f"{'(above)' if choice['refused'] else '(it holds no rows)'}; the recipe as it is",
            file=sys.stderr,
        )
        sys.exit(2)
    for row in choice["candidates"]:
        print(f"  {row['config']}: ~{row['expected_images']:,} images", file=sys.stderr)
    busy = choice["gpu_busy_share"]
    print(
        f"chosen: {choice['row']}, ~{choice['expected_epochs']} epochs in a budget of "
        f"{choice['time_budget']:g} s; GPU busy "
        f"{'unknown' if busy is None else f'{100 * busy:.0f}%'} of its step: seeds "
        f"{'side by side' if choice['together'] else 'one after the other'}",
        file=sys.stderr,
    )
    print(int(choice["together"]))
    print(" ".join(choice["flags"]))


if __name__ == "__main__":
    main()
