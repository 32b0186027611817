"""Inference throughput of our ViT against timm's, same weights, same batch, same device.

    python benchmarks/inference_throughput.py [--models vit_tiny_patch16_224 ...] [--batch-size 16]
        [--device cuda] [--dtypes float32 bfloat16] [--json FILE]

The two models are timed in alternating rounds (ours, timm, ours, timm, ...) so that any
drift in machine load hits both alike; each reports its median round. Before timing, the
script checks that both give the same logits (under the same autocast for bfloat16). A model
timm does not name (the CIFAR models, e.g. vit_cifar_patch4_32) is compared with timm's
VisionTransformer built with the same architecture arguments. float32 runs in float32 (TF32
off); bfloat16 under autocast. --json writes every row, with the peak GPU memory of each
model's rounds on CUDA, for scripts/gpu_check.sh.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path

import _cli
import timm
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.cli.flags import number_in
from vit.models.registry import MODELS
from vit.utils.files import atomic_write_text
from vit.utils.ranges import AT_LEAST_1

DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


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


def timm_model(name: str) -> torch.nn.Module:
    """timm's model of that name, or for a name timm lacks (our CIFAR models) timm's
    VisionTransformer with our architecture arguments."""
    if name in timm.list_models():
        return timm.create_model(name)
    spec = MODELS[name]
    return TimmViT(**spec.arch, num_classes=spec.num_classes)


@torch.inference_mode()
def compare(
    name: str,
    batch_size: int,
    rounds: int,
    iters: int,
    device: str,
    fused: bool,
    dtype: str = "float32",
) -> dict:
    torch.manual_seed(0)
    theirs = timm_model(name).eval().to(device)
    ours = vit.create_model(name).eval().to(device)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.set_fused_attn(fused)
    batch = torch.randn(batch_size, 3, *ours.patch_embed.img_size, device=device)
    autocast = (
        torch.autocast(batch.device.type, dtype=DTYPES[dtype])
        if DTYPES[dtype]
        else contextlib.nullcontext()
    )
    cuda = batch.is_cuda
    with autocast:
        reference = theirs(batch).float()
        error = ((ours(batch).float() - reference).abs().max() / reference.abs().max()).item()
        for model in (ours, theirs):  # warm-up: allocator, kernels, caches
            time_round(model, batch, 2)
        times = {"ours": [], "timm": []}
        peak = {"ours": 0, "timm": 0}
        for _ in range(rounds):
            for side, model in (("ours", ours), ("timm", theirs)):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                times[side].append(time_round(model, batch, iters))
                if cuda:
                    peak[side] = max(peak[side], torch.cuda.max_memory_allocated())
    images = batch_size * iters
    ours_ips = images / statistics.median(times["ours"])
    timm_ips = images / statistics.median(times["timm"])
    row = dict(model=name, dtype=dtype, batch=batch_size, ours=ours_ips, timm=timm_ips)
    row.update(ratio=ours_ips / timm_ips, error=error)
    if cuda:
        row.update(ours_peak_bytes=peak["ours"], timm_peak_bytes=peak["timm"])
    return row


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument(
        "--models",
        nargs="+",
        default=["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"],
    )
    count = number_in(AT_LEAST_1)  # 0 images, rounds or passes: no figure to give
    parser.add_argument("--batch-size", type=count, default=16)
    parser.add_argument("--rounds", type=count, default=7)
    parser.add_argument("--iters", type=count, default=3, help="forward passes per timed round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--explicit", action="store_true", help="time our explicit-softmax path")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=list(DTYPES),
        default=["float32"],
        help="float32 (TF32 off), and/or bfloat16 (autocast)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the rows here")
    args = parser.parse_args(argv)
    _cli.check_names(parser, "--models", args.models, MODELS)
    _cli.checked_device(parser, args.device)
    _cli.check_json(parser, args.json)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    path = "explicit softmax" if args.explicit else "fused SDPA"
    device_name = torch.cuda.get_device_name(args.device) if "cuda" in args.device else "cpu"
    print(
        f"device={args.device} ({device_name}) torch={torch.__version__} timm={timm.__version__} "
        f"threads={torch.get_num_threads()} batch={args.batch_size} ours={path}; "
        f"{_cli.machine(args.device)}"
    )
    print("| model | dtype | ours img/s | timm img/s | ours / timm | max rel. logit diff |")
    print("|---|---|---:|---:|---:|---:|")
    rows = []
    for name in args.models:
        for dtype in args.dtypes:
            r = compare(
                name,
                args.batch_size,
                args.rounds,
                args.iters,
                args.device,
                fused=not args.explicit,
                dtype=dtype,
            )
            rows.append(r)
            print(
                f"| {r['model']} | {dtype} | {r['ours']:.1f} | {r['timm']:.1f} | "
                f"{r['ratio']:.3f} | {r['error']:.1e} |",
                flush=True,
            )
    if args.json is not None:
        settings = dict(device=args.device, device_name=device_name, attention=path)
        settings.update(torch=torch.__version__, timm=timm.__version__, rounds=args.rounds)
        record = {**settings, "iters": args.iters, "rows": rows}
        atomic_write_text(args.json, json.dumps(record, indent=1))


if __name__ == "__main__":
    _cli.run(main)
