"""Inference throughput of our ViT against timm's, same weights, same batch, same device.

    python benchmarks/inference_throughput.py [--models vit_tiny_patch16_224 ...] [--batch-size 16]

The two models are timed in alternating rounds (ours, timm, ours, timm, ...) so that any
drift in machine load hits both alike; each reports its median round. Before timing, the
script checks that both give the same logits.
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

import vit


def time_round(model: torch.nn.Module, batch: torch.Tensor, iters: int) -> float:
    """Seconds for `iters` forward passes."""
    if batch.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        model(batch)
    if batch.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


@torch.inference_mode()
def compare(name: str, batch_size: int, rounds: int, iters: int, device: str, fused: bool) -> dict:
    torch.manual_seed(0)
    theirs = timm.create_model(name).eval().to(device)
    ours = vit.create_model(name).eval().to(device)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.set_fused_attn(fused)
    batch = torch.randn(batch_size, 3, *ours.patch_embed.img_size, device=device)
    reference = theirs(batch)
    error = ((ours(batch) - reference).abs().max() / reference.abs().max()).item()
    for model in (ours, theirs):  # warm-up: allocator, kernels, caches
        time_round(model, batch, 2)
    times = {"ours": [], "timm": []}
    for _ in range(rounds):
        times["ours"].append(time_round(ours, batch, iters))
        times["timm"].append(time_round(theirs, batch, iters))
    images = batch_size * iters
    ours_ips = images / statistics.median(times["ours"])
    timm_ips = images / statistics.median(times["timm"])
    return dict(model=name, ours=ours_ips, timm=timm_ips, ratio=ours_ips / timm_ips, error=error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"],
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=3, help="forward passes per timed round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--explicit", action="store_true", help="time our explicit-softmax path")
    args = parser.parse_args()

    path = "explicit softmax" if args.explicit else "fused SDPA"
    print(
        f"device={args.device} torch={torch.__version__} timm={timm.__version__} "
        f"threads={torch.get_num_threads()} batch={args.batch_size} ours={path}"
    )
    print("| model | ours img/s | timm img/s | ours / timm | max rel. logit diff |")
    print("|---|---:|---:|---:|---:|")
    for name in args.models:
        r = compare(name, args.batch_size, args.rounds, args.iters, args.device, not args.explicit)
        print(
            f"| {r['model']} | {r['ours']:.1f} | {r['timm']:.1f} | {r['ratio']:.3f} "
            f"| {r['error']:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
