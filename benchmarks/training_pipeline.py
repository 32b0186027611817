"""Training throughput of whole pipelines, side by side in one run: today's GPU recipe
(configs/cifar10.yaml: per-image augmentation in loader processes, batch 128, eager steps)
against the speedrun (configs/cifar10_gpu_speedrun.yaml: batches held and augmented on the
device, model and loss compiled, CUDA graphs), for model sizes, through train.py's own epoch
loop (`vit.training.engine.train_one_epoch`) on real images.

    python benchmarks/training_pipeline.py --data ../shared/data/cifar10-jpg --device cuda
    python benchmarks/training_pipeline.py --data DATA --device cpu --images 1024 \\
        --shapes 64d-2L-2h-r2 --set compile=false distillation_type=none  # the mechanics, on a CPU

(distillation_type=none: with the speedrun's CNN teacher, trained 20 epochs before the first
step, the check ran for minutes on a CPU; without it, 20-80 s on 2 cores.)

Per row: training images/s and ms per step (the median of --epochs epochs of --images images,
after one warm-up epoch that compiles and starts the loader), the warm-up epoch's seconds (the
compiler's caches empty for each row, as on a bare machine), the last epoch's loss, whether the
step's and the update's CUDA graphs were captured, the share of the epoch the loop waited for
batches, and on a GPU, from the profiler over one more epoch, the share of it the
GPU ran at least one kernel or copy (the profiler's own cost on the host makes it a lower
bound), the kernels that took most of the GPU's time and the host operations that took most of
the host's (whether the GPU or the host sets the pace, and what for). A row's configuration is the
YAML's, with `--amp` on a GPU (how scripts/train.sh runs configs/cifar10.yaml there), the
data, the device and the image count given here, and its model's shape replaced per --shapes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

import _cli
import torch
import yaml
from torch.autograd import DeviceType
from training_throughput import parse_shape

from vit.cli.flags import number_in, train_setting
from vit.data.workers import usable_cores
from vit.training.build import start
from vit.training.checkpoint import CheckpointSaver
from vit.training.engine import start_epoch, train_one_epoch
from vit.training.settings import TrainConfig
from vit.utils.files import atomic_write_text
from vit.utils.messages import one_line
from vit.utils.process_group import DistInfo
from vit.utils.ranges import AT_LEAST_0, AT_LEAST_1

ROOT = Path(__file__).resolve().parents[1]
# A row's pipeline: a YAML recipe, with settings of its own after a colon. The speedrun with
# its update eager, as it is, and its whole step as one CUDA graph: what --graph-update and
# --graph-step change.
CONFIGS = [
    "configs/cifar10.yaml",
    "configs/cifar10_gpu_speedrun.yaml:graph_update=false",
    "configs/cifar10_gpu_speedrun.yaml",
    "configs/cifar10_gpu_speedrun.yaml:graph_step=true,compile_mode=default",
]
# the speedrun's model and the 200-epoch recipe's (Lee et al. 2021's 2.7M ViT)
SHAPES = ["config", "192d-9L-12h-r2"]


TOP = 8  # the kernels and host operations a row names, by their time


def row_config(pipeline: str, shape: str, args: argparse.Namespace, device: torch.device):
    """The TrainConfig of one row: the settings of `pipeline` (a YAML file, then any
    ':KEY=VALUE,KEY=VALUE' after it), the model's shape per `shape` ("config": the YAML's own),
    the data, device, image count and loader processes of this benchmark, and the --set
    settings."""
    path, _, own = pipeline.partition(":")
    settings = yaml.safe_load((ROOT / path).read_text())
    settings.update(train_setting(item) for item in own.split(",") if item)
    cfg = TrainConfig(**settings)
    model_kwargs = dict(cfg.model_kwargs)
    if shape != "config":
        model_kwargs.update(parse_shape(shape)[1])
    settings = {
        "data": args.data,
        "device": str(device),
        "amp": cfg.amp or device.type == "cuda",
        "model_kwargs": model_kwargs,
        "train_subset": args.images,
        "test_subset": None,
        "epochs": max(cfg.epochs, 2 + args.epochs),  # the schedule's length only
        "workers": cfg.workers if cfg.batch_augment else args.workers,
        "cache_dir": None if args.cache_dir.lower() == "none" else args.cache_dir,
        "resume": None,
        "output_dir": None,
        "seed": 0,
    }
    return replace(cfg, **{**settings, **dict(args.set)})


def measure(cfg: TrainConfig, epochs: int, device: torch.device) -> dict:
    """One row: a warm-up epoch, `epochs` timed ones, and on a GPU one under the profiler."""
    info = DistInfo()
    torch._dynamo.reset()
    # every row compiles from nothing, as a run on a bare machine does: its first epoch's
    # seconds are what the speedrun's choice of flags weighs (scripts/choose_speedrun_flags.py)
    with tempfile.TemporaryDirectory() as folder, fresh_compiler_caches():
        saver = CheckpointSaver(Path(folder), info, data=cfg.data, config=cfg.to_dict())
        run = start(cfg, info, device, saver)
        steps = len(run.train_loader)
        start_epoch(run, 0)
        synchronize(device)
        started = time.perf_counter()
        train_one_epoch(run, epoch=0)  # compilation, CUDA graph capture, loader start
        warm_up_seconds = time.perf_counter() - started
        seconds, waits, losses = [], [], []
        for epoch in range(1, 1 + epochs):
            start_epoch(run, epoch)
            synchronize(device)
            started = time.perf_counter()
            stats = train_one_epoch(run, epoch=epoch)  # ends with a read of its sums: synced
            seconds.append(time.perf_counter() - started)
            waits.append(stats["data_seconds"] / seconds[-1])
            losses.append(stats["loss"])
        shares, busy_error = {}, None
        if device.type == "cuda":
            try:  # the profiler over CUDA graph replays: its failure keeps the row's timings
                shares = gpu_time(run, 1 + epochs)
            except RuntimeError as error:
                traceback.print_exc()
                busy_error = described(error)
    epoch_seconds = statistics.median(seconds)
    return {
        "params_m": sum(p.numel() for p in run.model.parameters()) / 1e6,
        "batch_size": cfg.batch_size,
        "steps_per_epoch": steps,
        "images_per_s": steps * cfg.batch_size / epoch_seconds,
        "ms_per_step": 1000 * epoch_seconds / steps,
        "data_wait_share": statistics.median(waits),
        # the first epoch's seconds: a timed epoch's and what compiling and capturing cost once
        "warm_up_seconds": warm_up_seconds,
        # --distillation-type: the seconds its teacher trained before the first step, over
        # this row's training images (a run of the whole split takes about as many times more)
        "teacher_seconds": (run.teacher_facts or {}).get("train_seconds", 0.0),
        "train_images": run.num_images,
        "train_loss": losses[-1],  # finite and falling where the step trains
        # whether the step's and the update's graphs were captured (None: not asked for, or
        # a CPU, which has none); a refused capture leaves the row timing the uncaptured steps
        "captured": {"step": captured(run.step, device), "update": captured(run.update, device)},
        "gpu_busy_share": shares.get("gpu_busy"),
        "gpu_top_kernels": shares.get("top_kernels"),
        "host_top_ops": shares.get("top_host"),
        **({"gpu_busy_error": busy_error} if busy_error else {}),
        "epoch_seconds": seconds,
    }


def fresh_compiler_caches():
    """torch's own context for empty inductor and Triton caches (a temporary folder), under
    the name of the installed release."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
    return fresh()


def captured(graph, device: torch.device) -> bool | None:
    """Whether a StepGraph's or an UpdateGraph's capture held: None where the row has none,
    or runs on a CPU (which captures nothing)."""
    return None if graph is None or device.type != "cuda" else graph.capturable


def gpu_time(run, epoch: int) -> dict:
    """One epoch under the profiler, its time shares (`time_shares`)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    start_epoch(run, epoch)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as profile:
        started = time.perf_counter()
        train_one_epoch(run, epoch=epoch)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    return time_shares(profile.events(), wall)


def time_shares(events, wall_seconds: float) -> dict:
    """Profiler events (`profile.events()`) over `wall_seconds` -> the share of the time the
    GPU ran at least one kernel or copy (`gpu_busy`), and the TOP kernels by device time and
    host operations by their own CPU time, each with its calls and share of the wall time.

    Whether the GPU or the host sets the pace: a GPU busy nearly all the time is the bound;
    one idle between kernels waits for the host, whose top operations say for what. The busy
    time is the union of the kernels' intervals, where summing each event's device time (as
    this benchmark first did) counted an eager kernel twice, under its aten operation and as
    itself, and overlapping kernels once each."""
    wall_us = wall_seconds * 1e6
    device = [
        event
        for event in events
        if event.device_type != DeviceType.CPU and not event.is_user_annotation
    ]
    busy_us, last_end = 0.0, float("-inf")
    for event in sorted(device, key=lambda event: event.time_range.start):
        start, end = max(event.time_range.start, last_end), event.time_range.end
        busy_us += max(0.0, end - start)
        last_end = max(last_end, end)
    host = [event for event in events if event.device_type == DeviceType.CPU]

    def top(chosen, microseconds) -> list[dict]:  # events grouped by name, the largest first
        totals: dict[str, list] = {}
        for event in chosen:
            total = totals.setdefault(event.name, [0, 0.0])
            total[0] += 1
            total[1] += microseconds(event)
        ranked = sorted(totals.items(), key=lambda item: item[1][1], reverse=True)[:TOP]
        return [
            {"name": name, "calls": calls, "share": time_us / wall_us}
            for name, (calls, time_us) in ranked
            if time_us > 0
        ]

    return {
        "gpu_busy": busy_us / wall_us,
        "top_kernels": top(device, lambda event: event.time_range.elapsed_us()),
        "top_host": top(host, lambda event: event.self_cpu_time_total),
    }


def described(error: Exception) -> str:
    """A failure as the JSON keeps it: its type and its message in one line."""
    return f"{type(error).__name__}: {one_line(error)}"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_parser() -> argparse.ArgumentParser:
    parser = _cli.parser(__doc__)
    parser.add_argument("--data", required=True, help="an image folder (train/, test/)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=CONFIGS,
        help="YAML recipes, one row each, with settings of the row's own after a colon: "
        "configs/cifar10_gpu_speedrun.yaml:graph_update=false,batch_size=1024",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=SHAPES,
        help="'config' (the YAML's model) or e.g. '192d-9L-12h-r2' (width, depth, heads, MLP "
        "ratio; '-p2' after it for patches of 2 pixels); rows with each",
    )
    count = number_in(AT_LEAST_1)
    parser.add_argument("--images", type=count, default=20480, help="training images per epoch")
    parser.add_argument("--epochs", type=count, default=2, help="timed epochs per row")
    parser.add_argument(
        "--workers",
        type=number_in(AT_LEAST_0),
        default=max(0, min(12, usable_cores() - 2)),
        help="loader processes of a per-image pipeline (default: cores - 2, at most 12, as "
        "scripts/gpu_check.sh's train stage)",
    )
    parser.add_argument(
        "--cache-dir", default="~/.cache/vit", help="decoded images kept here; none for off"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        type=train_setting,
        default=[],
        metavar="KEY=VALUE",
        help="train.py settings for every row, e.g. compile=false distillation_type=none (the "
        "CPU check of mechanics)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    _cli.check_data(parser, args.data)
    device = _cli.checked_device(parser, args.device)
    _cli.check_json(parser, args.json)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    environment = {"device": name, "torch": torch.__version__, "images": args.images}
    rows = []
    # Model by model, today's pipeline beside the new one: when a GPU call's time runs out, the
    # rows done are pairs, and each is in the JSON the moment it is measured.
    for shape in args.shapes:
        for path in args.configs:
            cfg = row_config(path, shape, args, device)
            print(f"== {path}, model {shape}: batch {cfg.batch_size}", file=sys.stderr, flush=True)
            try:
                rows.append({"config": path, "shape": shape, **measure(cfg, args.epochs, device)})
            except Exception as error:  # one row's failure (a compiler's, say) is that row's
                traceback.print_exc()  # the whole of it in the log: a GPU call is not repeated
                rows.append({"config": path, "shape": shape, "error": described(error)})
            if args.json:
                record = {"environment": environment, "rows": rows}
                # atomically: gpu_check.sh stops this benchmark with SIGINT at its deadline,
                # which must find the last rows' file whole, never half rewritten
                atomic_write_text(args.json, json.dumps(record, indent=1))
    print_table(rows, device, args)
    if any("error" in row for row in rows):
        sys.exit(1)


def print_table(rows: list[dict], device: torch.device, args: argparse.Namespace) -> None:
    """The rows as a Markdown table, under a line naming the machine and the settings."""
    print(
        f"{_cli.machine(device)}; torch {torch.__version__}; {args.images} images an epoch, "
        f"median of {args.epochs} epochs after one warm-up; bfloat16 autocast on a GPU"
    )
    print(
        "| pipeline | model | params | batch | img/s | ms/step | waiting for data | GPU busy "
        "| first epoch |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for row in rows:
        if "error" in row:
            print(f"| {row['config']} | {row['shape']} | failed: {row['error']} | | | | | | |")
            continue
        busy = "n/a" if row["gpu_busy_share"] is None else f"{100 * row['gpu_busy_share']:.0f}%"
        print(
            f"| {row['config']} | {row['shape']} | {row['params_m']:.2f}M | {row['batch_size']} "
            f"| {row['images_per_s']:,.0f} | {row['ms_per_step']:.2f} "
            f"| {100 * row['data_wait_share']:.0f}% | {busy} | {row['warm_up_seconds']:.1f} s |"
        )


if __name__ == "__main__":
    _cli.run(main)
