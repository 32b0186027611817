"""What --grad-accum-steps and --grad-checkpointing save: the peak memory of training steps of
a large ViT over the same images a step, as one batch, with activations recomputed, and as
batches accumulated, each row in a fresh process (its peak resident memory is the row's alone).

    python benchmarks/training_memory.py          # ViT-B/16 at 224 px, 32 images a step
    python benchmarks/training_memory.py --model vit_small_patch16_224 --images 64 --device cuda

Per row: the peak memory (resident set on a CPU, the allocator's peak on a GPU), the seconds of an
optimizer step (the median of --steps after one warm-up step) and the last step's mean loss.
Each step is what train.py runs: the mean cross-entropy of every batch divided by the number
of batches, backward passes adding up the gradients, then one AdamW step; random images and
labels from a fixed seed, so every row trains on the same numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import statistics
import subprocess
import sys
import time

import _cli
import torch
import torch.nn.functional as F

import vit
from vit.cli.flags import number_in
from vit.models.registry import MODELS
from vit.utils.ranges import AT_LEAST_1

# name -> (batches a step, recompute activations)
ROWS = {
    "one-batch": (1, False),
    "checkpointing": (1, True),
    "accum-4": (4, False),
    "accum-4-checkpointing": (4, True),
}


def measure(model_name: str, images: int, batches: int, recompute: bool, steps: int, device: str):
    """One row in this process: (peak MiB, median seconds a step, the last step's loss)."""
    torch.manual_seed(0)
    model = vit.create_model(model_name, num_classes=10).to(device).train()
    model.set_grad_checkpointing(recompute)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    size = model.patch_embed.img_size
    x = torch.randn(images, 3, *size, generator=torch.Generator().manual_seed(1)).to(device)
    y = torch.arange(images, device=device) % 10
    seconds = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for part_x, part_y in zip(x.chunk(batches), y.chunk(batches), strict=True):
            part = F.cross_entropy(model(part_x), part_y) / batches  # of (B, 10) logits
            part.backward()
            loss += part.item()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    return peak, statistics.median(seconds[1:]), loss


def failure(done: subprocess.CompletedProcess) -> str:
    """Why a row's process failed: its last line on stderr (its exception's), or the signal
    that ended it (the kernel's out-of-memory killer sends SIGKILL, which leaves no line)."""
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = _cli.parser(__doc__)
    parser.add_argument("--model", default="vit_base_patch16_224")
    count = number_in(AT_LEAST_1)  # 0 steps or images: a failed child, not a figure
    parser.add_argument("--images", type=count, default=32, help="images an optimizer step")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--steps", type=count, default=2, help="timed steps after one warm-up")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=count, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _cli.check_names(parser, "--model", [args.model], MODELS)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:  # one row, in its own process
        batches, recompute = ROWS[args.child]
        row = measure(args.model, args.images, batches, recompute, args.steps, args.device)
        print(json.dumps(row))
        return 0
    device = _cli.checked_device(parser, args.device)
    print(f"{args.model}, {args.images} images an optimizer step, {args.device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{_cli.machine(device)}")  # fmt: skip
    print(f"{'row':<24} {'batch':>6} {'peak MiB':>9} {'s a step':>9} {'loss':>10}")
    failed = False
    for name in args.rows:
        command = [sys.executable, __file__, "--child", name, "--model", args.model]
        command += ["--images", str(args.images), "--steps", str(args.steps)]
        command += ["--device", args.device]
        command += ["--threads", str(args.threads)] if args.threads else []
        done = subprocess.run(command, capture_output=True, text=True)
        batch = args.images // ROWS[name][0]
        if done.returncode != 0:
            # marked and passed: a row out of memory is a finding, and the rows after it
            # (activations recomputed, batches accumulated) are those that may still fit
            print(f"{name:<24} {batch:>6} {'failed':>9}", flush=True)
            print(f"{parser.prog}: row {name} failed: {failure(done)}", file=sys.stderr)
            failed = True
            continue
        peak, seconds, loss = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name:<24} {batch:>6} {peak:>9.0f} {seconds:>9.2f} {loss:>10.5f}")
    return 1 if failed else 0


if __name__ == "__main__":
    _cli.run(main)
