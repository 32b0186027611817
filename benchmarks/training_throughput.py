"""Training throughput (forward + backward + optimizer step) of CIFAR-sized ViT shapes on this
machine, and how close it comes to the machine's float32 matmul peak.

    python benchmarks/training_throughput.py                       # the default grid
    python benchmarks/training_throughput.py --threads 1 --sizes 16 32 --patch-drop 0 0.5
    python benchmarks/training_throughput.py --threads 1 --sizes 32 --opt adamw muon
    python benchmarks/training_throughput.py --threads 1 --sizes 32 --dtypes float32 bfloat16

GFLOP/s counts the step's matmul, convolution and attention FLOPs (forward and backward, as
torch.utils.flop_counter counts them) per second; "% peak" divides it by the float32 matmul
peak measured first, in the same run, with the same threads (a 1024^3 matmul); bfloat16 rows
(`--dtypes bfloat16`: the step under `torch.autocast("cpu", torch.bfloat16)`, as `train.py --amp`
runs it) are also set against the bfloat16 matmul peak, measured the same way. The processor's
instruction sets are printed first: bfloat16 is fast only where the CPU has AVX512-BF16 or AMX.

Every shape is `vit_cifar_patch4_32` with the CPU recipe's pooling (the mean of the patch
tokens, no class token), as the recipe trains it. The figures docs/ quotes from before this
choice (2026-11-25) were measured with a class token: one token more, 33 or 65.

Every (shape, image size, patch-drop rate) row is timed in alternating rounds with the others,
so that a change in machine load hits every row alike; each row reports its median round.
Compare rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import vit
from vit.inference.cpu_paths import cpu_flags
from vit.training.optimizers import build_optimizer

# (label, ViTConfig overrides on top of vit_cifar_patch4_32)
SHAPES = {
    "128d-4L-4h-r2 (0.55M)": {"embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_ratio": 2.0},
    "192d-6L-3h-r2 (1.8M)": {"embed_dim": 192, "depth": 6, "num_heads": 3, "mlp_ratio": 2.0},
    "256d-6L-4h-r2 (3.2M)": {"embed_dim": 256, "depth": 6, "num_heads": 4, "mlp_ratio": 2.0},
    "192d-9L-12h-r2 (2.7M)": {"embed_dim": 192, "depth": 9, "num_heads": 12, "mlp_ratio": 2.0},
    # the shape of omihub777/ViT-CIFAR's 6.3M model (hidden 384, 7 layers, 12 heads, MLP 384)
    "384d-7L-12h-r1 (6.3M)": {"embed_dim": 384, "depth": 7, "num_heads": 12, "mlp_ratio": 1.0},
}


def parse_shape(label: str) -> tuple[str, dict]:
    """(label, ViTConfig overrides) for a shape label: one of SHAPES, or any
    "<width>d-<depth>L-<heads>h-r<MLP ratio>" such as "192d-4L-6h-r2" (a scan's other shapes),
    with "-p<patch size>" after it for patches other than 4 pixels ("256d-8L-4h-r2-p2": 256
    tokens of a 32x32 image instead of 64)."""
    if label in SHAPES:
        return label, SHAPES[label]
    match = re.fullmatch(r"(\d+)d-(\d+)L-(\d+)h-r([\d.]+)(?:-p(\d+))?", label)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"shape {label!r}: expected one of {list(SHAPES)} or e.g. '192d-4L-6h-r2' "
            "('192d-4L-6h-r2-p2' for patches of 2 pixels)"
        )
    width, depth, heads, ratio, patch = match.groups()
    shape = {
        "embed_dim": int(width),
        "depth": int(depth),
        "num_heads": int(heads),
        "mlp_ratio": float(ratio),
    }
    return label, shape if patch is None else {**shape, "patch_size": int(patch)}


def matmul_peak_gflops(size: int = 1024, repeats: int = 20, dtype=torch.float32) -> float:
    """The best of `repeats` (size x size) @ (size x size) matmuls in `dtype`, in GFLOP/s."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def step_flops(step) -> int:
    """FLOPs of one call of `step` (matmuls, convolutions, attention; forward and backward)."""
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops()


# the CPU recipe's pooling (configs/cifar10_cpu.yaml): the mean of the patch tokens, no class token
RECIPE_POOLING = {"global_pool": "avg", "class_token": False}


def make_step(
    shape: dict,
    img_size: int,
    batch_size: int,
    patch_drop: float,
    opt: str,
    dtype: str,
    compile: bool = False,
    muon_ns_dtype: str = "float32",
):
    """A closure running one training step of `shape` (with the recipe's pooling unless it says
    otherwise) on a fixed random batch: the forward pass and loss under bfloat16 autocast for
    dtype "bfloat16", through the explicit attention path as train.py --amp does on a CPU
    (vit.training.build.wrap_model says why); compiled by torch.compile as train.py --compile
    does if `compile`. The optimizer step runs inside a profiler range named "optimizer step" (for
    benchmarks/step_profile.py; free without a profiler). Returns (model, optimizer, step)."""
    torch.manual_seed(0)
    model = vit.create_model(
        "vit_cifar_patch4_32",
        num_classes=10,
        img_size=img_size,
        patch_drop_rate=patch_drop,
        **{**RECIPE_POOLING, **shape},
    ).train()
    model.set_fused_attn(dtype != "bfloat16")
    optimizer = build_optimizer(model, opt, lr=2e-3, weight_decay=0.05, muon_ns_dtype=muon_ns_dtype)
    forward = torch.compile(model) if compile else model
    images = torch.randn(batch_size, 3, img_size, img_size)
    labels = torch.randint(0, 10, (batch_size,))

    def step() -> None:
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = F.cross_entropy(forward(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        with torch.profiler.record_function("optimizer step"):
            optimizer.step()

    return model, optimizer, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=list(SHAPES.items()),
        help=f"any of {list(SHAPES)}, or e.g. '192d-4L-6h-r2' (width, depth, heads, MLP ratio)",
    )
    parser.add_argument("--sizes", nargs="+", type=int, default=[16, 24, 32])
    parser.add_argument("--patch-drop", nargs="+", type=float, default=[0.0])
    parser.add_argument(
        "--batch-size", nargs="+", type=int, default=[128], help="rows with each batch size"
    )
    parser.add_argument("--opt", nargs="+", default=["adamw"], choices=["adamw", "muon"])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument(
        "--muon-ns-dtypes",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16"],
        help="rows with Muon's Newton-Schulz iteration in each (as train.py --muon-ns-dtype)",
    )
    parser.add_argument(
        "--compile",
        nargs="+",
        choices=["off", "on"],
        default=["off"],
        help="rows without and/or with torch.compile of the model (as train.py --compile)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps per round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    peaks = {"float32": matmul_peak_gflops()}
    if "bfloat16" in args.dtypes:
        peaks["bfloat16"] = matmul_peak_gflops(dtype=torch.bfloat16)
    # (optimizer, dtype of Muon's Newton-Schulz iteration)
    optimizers = [(opt, "float32") for opt in args.opt if opt == "adamw"]
    optimizers += [("muon", ns) for ns in args.muon_ns_dtypes if "muon" in args.opt]
    rows = {}
    for label, shape in dict(args.shapes).items():
        for size in args.sizes:
            for drop in args.patch_drop:
                for batch, optimizer, dtype, compiled in itertools.product(
                    args.batch_size, optimizers, args.dtypes, args.compile
                ):
                    opt, ns_dtype = optimizer
                    setting = (shape, size, batch, drop, opt, dtype)
                    model, _, step = make_step(
                        *setting, compile=compiled == "on", muon_ns_dtype=ns_dtype
                    )
                    step()  # warm-up: allocator, kernels (and compilation)
                    # a compiled graph hides its ops from the counter, and compiling changes
                    # no FLOP: a compiled row is counted on an eager twin
                    eager_step = (
                        step
                        if compiled == "off"
                        else make_step(*setting, muon_ns_dtype=ns_dtype)[2]
                    )
                    name = opt if opt == "adamw" else f"{opt} ({ns_dtype} NS)"
                    rows[(label, size, drop, batch, name, dtype, compiled)] = {
                        "step": step,
                        "times": [],
                        "params": sum(p.numel() for p in model.parameters()) / 1e6,
                        "prefix": model.num_prefix_tokens,  # class token and the like
                        "tokens": model.patch_embed.num_patches,  # of an image of `size`
                        "flops": step_flops(eager_step),
                    }
    for _ in range(args.rounds):
        for row in rows.values():
            started = time.perf_counter()
            for _ in range(args.steps):
                row["step"]()
            row["times"].append(time.perf_counter() - started)

    shown = ", ".join(
        f"{dtype} matmul peak {gflops:.1f} GFLOP/s" for dtype, gflops in peaks.items()
    )
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), "
        f"median of {args.rounds} rounds of {args.steps} steps; CPU flags: {cpu_flags()}; {shown}"
    )
    print(
        "| shape | params | image | tokens | patch drop | batch | optimizer | dtype | compiled "
        "| img/s | GFLOP/s | % fp32 peak | % own peak |\n"
        "|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|"
    )
    for (label, size, drop, batch, opt, dtype, compiled), row in rows.items():
        kept = row["tokens"] - int(row["tokens"] * drop)
        seconds = statistics.median(row["times"]) / args.steps  # one step
        gflops = row["flops"] / seconds / 1e9
        print(
            f"| {label} | {row['params']:.2f}M | {size} | {kept}+{row['prefix']} | {drop:.2f} "
            f"| {batch} | {opt} "
            f"| {dtype} | {compiled} | {batch / seconds:.0f} | {gflops:.1f} "
            f"| {100 * gflops / peaks['float32']:.0f}% | {100 * gflops / peaks[dtype]:.0f}% |"
        )


if __name__ == "__main__":
    main()
