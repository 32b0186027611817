"""Muon's optimizer step on this CPU: PyTorch's (bfloat16 Newton-Schulz) against ours (float32),
and both against a whole training step of the same model.

    python benchmarks/muon_step.py --threads 1

The two optimizers update the blocks' weight matrices of the CPU recipe's model (a fused qkv
counted as one matrix for PyTorch's, three for ours), with the same random gradients; rounds
alternate between them so that a change in machine load hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import vit
from vit.optim import Muon


def recipe_model() -> vit.VisionTransformer:
    return vit.create_model(
        "vit_cifar_patch4_32",
        embed_dim=128,
        depth=4,
        num_heads=4,
        global_pool="avg",
        class_token=False,
        num_classes=10,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = recipe_model().train()
    hidden = [p for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]
    for p in hidden:
        p.grad = torch.randn_like(p)
    qkv = [p for n, p in model.named_parameters() if n.endswith("attn.qkv.weight")]
    others = [p for p in hidden if all(p is not q for q in qkv)]
    optimizers = {
        "torch.optim.Muon (bfloat16 Newton-Schulz)": torch.optim.Muon(
            hidden, lr=1e-3, adjust_lr_fn="match_rms_adamw"
        ),
        "vit.optim.Muon (float32, qkv split in 3)": Muon(
            [
                {"params": others, "use_muon": True},
                {"params": qkv, "use_muon": True, "splits": 3},
            ],
            lr=1e-3,
        ),
    }
    images = torch.randn(args.batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch_size,))

    def training_step() -> None:  # forward + backward only: what the optimizer step adds to
        model.zero_grad(set_to_none=False)
        F.cross_entropy(model(images), labels).backward()

    jobs = {name: opt.step for name, opt in optimizers.items()}
    jobs[f"forward + backward, batch {args.batch_size}"] = training_step
    times = {name: [] for name in jobs}
    for job in jobs.values():
        job()  # warm-up
    for _ in range(args.rounds):
        for name, job in jobs.items():
            started = time.perf_counter()
            for _ in range(args.steps):
                job()
            times[name].append((time.perf_counter() - started) / args.steps)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.rounds} rounds")
    print("| what | ms per step |\n|---|---:|")
    for name, values in times.items():
        print(f"| {name} | {1000 * statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
