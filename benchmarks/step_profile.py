"""Where a training step's time goes on this CPU, and what bounds its share of the matmul peak.

    python benchmarks/step_profile.py --threads 1                      # the recipe's step, bf16
    python benchmarks/step_profile.py --threads 1 --dtype float32 --batch-size 64 128

One process runs the CPU recipe's training step (forward and loss under bfloat16 autocast
through the explicit attention path as `train.py --amp` runs it, or in float32; backward; Muon,
its Newton-Schulz work not shared) and splits its time into: the model's matrix products (mm,
addmm, bmm, baddbmm, forward and backward; their own time and FLOPs from torch.profiler, so
their GFLOP/s against the matmul peak measured in the same run), the optimizer step (of which
its Newton-Schulz products), and the rest (casts, LayerNorm, GELU, softmax, copies, the patch
embedding, the loss). The step and the optimizer step are timed without the profiler, which
adds tens of microseconds to every operator.

The step's share of the peak is the product of two figures this prints: how fast the model's
products run (at its small shapes, against a 1024^3 product's peak) and how much of the step
they are. Where the second is low, faster products alone cannot lift the step far.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vit.cli.flags import number_in
from vit.inference.cpu_paths import cpu_flags
from vit.utils.ranges import AT_LEAST_1

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cli  # noqa: E402
from training_throughput import (  # noqa: E402
    make_step,
    matmul_peak_gflops,
    parse_shape,
)

# the ops that do a product's arithmetic (wrappers such as aten::linear or aten::matmul call one)
KERNELS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def median_ms(function, rounds: int = 5, repeats: int = 5) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            function()
        times.append((time.perf_counter() - started) / repeats * 1e3)
    return statistics.median(times)


def breakdown(step, optimizer_step, steps: int) -> dict:
    """Milliseconds per step: the step and the optimizer step timed without the profiler (which
    adds tens of microseconds to every operator), the matrix products' own time and FLOPs from
    the profiler (a few dozen calls per step: its overhead is small against theirs)."""
    for _ in range(3):
        step()  # warm-up
    timed = {"step": median_ms(step), "optimizer": median_ms(optimizer_step)}
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(steps):
            step()
    events = prof.events()
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == "optimizer step"]

    def in_optimizer(event) -> bool:
        return any(start <= event.time_range.start < end for start, end in spans)

    products = [e for e in events if e.name in KERNELS]
    model_products = [e for e in products if not in_optimizer(e)]
    optimizer_products = [e for e in products if in_optimizer(e)]
    return {
        **timed,
        "model products": sum(e.self_cpu_time_total for e in model_products) / steps / 1e3,
        "model product flops": sum(e.flops or 0 for e in model_products) / steps,
        "optimizer products": sum(e.self_cpu_time_total for e in optimizer_products) / steps / 1e3,
        "optimizer product flops": sum(e.flops or 0 for e in optimizer_products) / steps,
    }


def main() -> None:
    parser = _cli.parser(__doc__)
    count = number_in(AT_LEAST_1)  # 0 images, threads or steps: no profile to give
    parser.add_argument(
        "--shapes", nargs="+", type=parse_shape, default=[parse_shape("128d-4L-4h-r2")]
    )
    parser.add_argument("--batch-size", nargs="+", type=count, default=[64])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument(
        "--muon-ns-dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"]
    )
    parser.add_argument("--threads", type=count, default=torch.get_num_threads())
    parser.add_argument("--steps", type=count, default=10, help="profiled steps per row")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peaks = {name: matmul_peak_gflops(dtype=getattr(torch, name)) for name in args.dtype}
    shown = ", ".join(f"{name} matmul peak {gflops:.1f} GFLOP/s" for name, gflops in peaks.items())
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} profiled steps per "
        f"row, patch drop 0.5 (32 of 64 tokens), Muon; CPU flags: {cpu_flags()}; {shown}"
    )
    print(
        "| shape | batch | dtype | NS dtype | step ms | model's products ms (% of step) "
        "| their GFLOP/s (% of peak) | optimizer ms (% of step) | of it products ms | rest ms "
        "| step GFLOP/s (% of peak) |\n"
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for (label, shape), batch, dtype, ns_dtype in itertools.product(
        args.shapes, args.batch_size, args.dtype, args.muon_ns_dtype
    ):
        _, optimizer, step = make_step(
            shape,
            img_size=32,
            batch_size=batch,
            patch_drop=0.5,
            opt="muon",
            dtype=dtype,
            muon_ns_dtype=ns_dtype,
        )
        row = breakdown(step, optimizer.step, args.steps)
        peak = peaks[dtype]
        products = row["model product flops"] / (row["model products"] / 1e3) / 1e9
        all_flops = row["model product flops"] + row["optimizer product flops"]
        step_gflops = all_flops / (row["step"] / 1e3) / 1e9
        rest = row["step"] - row["model products"] - row["optimizer"]
        print(
            f"| {label} | {batch} | {dtype} | {ns_dtype} | {row['step']:.1f} "
            f"| {row['model products']:.1f} ({100 * row['model products'] / row['step']:.0f}%) "
            f"| {products:.0f} ({100 * products / peak:.0f}%) "
            f"| {row['optimizer']:.1f} ({100 * row['optimizer'] / row['step']:.0f}%) "
            f"| {row['optimizer products']:.1f} | {rest:.1f} "
            f"| {step_gflops:.0f} ({100 * step_gflops / peak:.0f}%) |"
        )


if __name__ == "__main__":
    _cli.run(main)
