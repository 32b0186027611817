"""What torch.compile costs before the speedrun's first training step: the whole step compiled
(model and loss in one graph, as `train.py --compile` does) against each encoder block compiled
on its own (regional compilation: blocks of one class can share one compiled graph) and the
whole step with the blocks as nested compile regions (torch.compiler.nested_compile_region: one
graph, in which the blocks' code is compiled once and stamped out for each, so that on a GPU
the step is still one CUDA graph), with and without stochastic depth. Each row runs in a fresh
process with empty compile caches, as a first run on a bare machine does.

    python benchmarks/compile_time.py                              # on the CPU, float32
    python benchmarks/compile_time.py --device cuda --mode reduce-overhead

Per row: seconds from the first call to the end of the first step's backward (tracing,
compilation, the step itself), the median of the next --steps steps in ms, and how many graphs
Dynamo compiled. The model is configs/cifar10_gpu_speedrun.yaml's, on random images; on a GPU
the step runs under bfloat16 autocast (the recipe's --amp), on a CPU in float32 (bfloat16 is
emulated on CPUs without AVX512-BF16). The rows' times are comparable within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _cli
import torch
import torch.nn.functional as F
import yaml
from training_pipeline import synchronize

from vit.cli.flags import number_in
from vit.utils.files import atomic_write_text
from vit.utils.ranges import AT_LEAST_1, DROP_RATE

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "cifar10_gpu_speedrun.yaml"
SCOPES = ("step", "blocks", "nested")


def run_row(args: argparse.Namespace) -> dict:
    """One row, in this process: build, compile, time the first step and the next ones."""
    from vit import create_model

    recipe = yaml.safe_load(RECIPE.read_text())
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = create_model(
        recipe["model"], num_classes=10, drop_path_rate=args.drop_path, **recipe["model_kwargs"]
    ).to(device)
    model.train()
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)  # (B, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)  # (B,)

    def step_loss() -> torch.Tensor:
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(images)  # (B, 10)
        return F.cross_entropy(logits.float(), labels)

    if args.scope == "nested":  # this process's Block class only: a row is a process of its own
        block_class = type(model.blocks[0])
        block_class.forward = torch.compiler.nested_compile_region(block_class.forward)
    if args.scope in ("step", "nested"):
        step_loss = torch.compile(step_loss, mode=args.mode, dynamic=False)
    else:
        for block in model.blocks:
            block.compile(mode=args.mode, dynamic=False)

    def timed_step() -> float:
        """Seconds of one forward and backward, the device's queue drained before and after."""
        synchronize(device)
        started = time.perf_counter()
        step_loss().backward()
        model.zero_grad(set_to_none=True)
        synchronize(device)
        return time.perf_counter() - started

    first = timed_step()  # tracing and compilation included
    seconds = [timed_step() for _ in range(args.steps)]
    from torch._dynamo.utils import counters

    return {
        "scope": args.scope,
        "drop_path": args.drop_path,
        "first_step_s": first,
        "later_step_ms": 1000 * statistics.median(seconds),
        "graphs": counters["stats"]["unique_graphs"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    count = number_in(AT_LEAST_1)  # 0 images, steps or threads: a failed row, not a figure
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="default", help="torch.compile's mode")
    parser.add_argument(
        "--batch-size", type=count, help="default: the recipe's on a GPU, 64 on a CPU"
    )
    parser.add_argument("--steps", type=count, default=5, help="steps timed after the first")
    parser.add_argument("--drop-paths", type=number_in(DROP_RATE), nargs="+", default=[0.0, 0.1])
    parser.add_argument("--scopes", nargs="+", choices=SCOPES, default=list(SCOPES))
    parser.add_argument("--threads", type=count, help="torch's CPU threads (default: torch's)")
    parser.add_argument("--row", nargs=2, metavar=("SCOPE", "DROP_PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if not args.row:  # before the first row's process: one line, not a child's traceback
        _cli.checked_device(parser, args.device)
        _cli.check_json(parser, args.json)
    if args.batch_size is None:
        recipe_batch = yaml.safe_load(RECIPE.read_text())["batch_size"]
        args.batch_size = recipe_batch if args.device.startswith("cuda") else 64
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.row:  # a child: one row, as a JSON line
        args.scope, args.drop_path = args.row[0], float(args.row[1])
        print(json.dumps(run_row(args)))
        return
    rows = []
    for drop_path in args.drop_paths:
        for scope in args.scopes:
            rows.append(child_row(args, scope, drop_path))
            print(f"== {scope}, drop_path {drop_path}: {rows[-1]}", file=sys.stderr, flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(
        f"{name}, torch {torch.__version__}, compile mode {args.mode}, batch {args.batch_size}; "
        f"model: {RECIPE.relative_to(ROOT)}'s"
    )
    print(
        "| compiled | drop_path | first step s | later step ms | graphs |\n"
        "|---|---:|---:|---:|---:|"
    )
    for row in rows:
        print(
            f"| {row['scope']} | {row['drop_path']} | {row['first_step_s']:.1f} "
            f"| {row['later_step_ms']:.1f} | {row['graphs']} |"
        )
    if args.json:
        atomic_write_text(args.json, json.dumps({"device": name, "rows": rows}, indent=1))


def child_row(args: argparse.Namespace, scope: str, drop_path: float) -> dict:
    """One row in a fresh process whose compile caches start empty."""
    with tempfile.TemporaryDirectory() as caches:
        environment = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor",
            "TRITON_CACHE_DIR": f"{caches}/triton",
        }
        command = [
            sys.executable,
            __file__,
            "--row",
            scope,
            str(drop_path),
            "--device",
            args.device,
            "--mode",
            args.mode,
            "--batch-size",
            str(args.batch_size),
            "--steps",
            str(args.steps),
            *(["--threads", str(args.threads)] if args.threads else []),
        ]
        done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"compile_time.py: the row {scope}, drop_path {drop_path} failed:\n"
            f"{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    _cli.run(main)
