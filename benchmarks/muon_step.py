"""Muon's optimizer step on this CPU: PyTorch's (bfloat16 Newton-Schulz) against ours (float32
and bfloat16, --muon-ns-dtype), and all against a whole training step of the same model.

    python benchmarks/muon_step.py --threads 1
    python benchmarks/muon_step.py --threads 1 --processes 2   # under torch.distributed (gloo)

The two optimizers update the blocks' weight matrices of the CPU recipe's model (a fused qkv
counted as one matrix for PyTorch's, three for ours), with the same random gradients; rounds
alternate between them so that a change in machine load hits both alike.

With --processes N, N processes (as torchrun + DDP would run them) time our Muon with the
Newton-Schulz work shared across the processes (one all-reduce per step) against every process
doing all of it, beside forward + backward; PyTorch's Muon is left out of that table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import _cli
import torch
import torch.distributed as dist
import torch.nn.functional as F

import vit
from vit.cli.flags import number_in
from vit.training.optimizers import Muon, muon_param_groups
from vit.utils.ranges import AT_LEAST_1


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


def muon(
    model: vit.VisionTransformer, share: bool = True, ns_dtype: torch.dtype = torch.float32
) -> Muon:
    """Our Muon on the blocks' weight matrices only (the recipe's Muon groups, no AdamW ones)."""
    groups = muon_param_groups(model, weight_decay=0.0, muon_lr=1e-3)
    muon_groups = [g for g in groups if g.get("use_muon")]
    return Muon(muon_groups, share_across_processes=share, ns_dtype=ns_dtype)


def measure(args: argparse.Namespace, rank: int = 0, world: int = 1) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = recipe_model().train()
    hidden = [p for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]
    for p in hidden:
        p.grad = torch.randn_like(p)
    if world == 1:
        optimizers = {
            "torch.optim.Muon (bfloat16 Newton-Schulz)": torch.optim.Muon(
                hidden, lr=1e-3, adjust_lr_fn="match_rms_adamw"
            ),
            "vit.training.optimizers.Muon (float32, qkv split in 3)": muon(model),
            "vit.training.optimizers.Muon (bfloat16, qkv split in 3)": muon(
                model, ns_dtype=torch.bfloat16
            ),
        }
    else:
        optimizers = {
            "vit.training.optimizers.Muon, every process orthogonalises every matrix": muon(
                model, share=False
            ),
            f"vit.training.optimizers.Muon, the work shared by {world} processes": muon(
                model, share=True
            ),
            f"vit.training.optimizers.Muon, bfloat16, the work shared by {world} processes": muon(
                model, share=True, ns_dtype=torch.bfloat16
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
            if world > 1:
                dist.barrier()  # every process starts each measurement together
            started = time.perf_counter()
            for _ in range(args.steps):
                job()
            times[name].append((time.perf_counter() - started) / args.steps)
    if rank == 0:
        print(
            f"torch {torch.__version__}, {world} process(es) x {args.threads} thread(s), "
            f"median of {args.rounds} rounds (process 0's times); {_cli.machine()}"
        )
        print("| what | ms per step |\n|---|---:|")
        for name, values in times.items():
            print(f"| {name} | {1000 * statistics.median(values):.2f} |")


def _process(rank: int, args: argparse.Namespace, init_file: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.processes
    )
    measure(args, rank, args.processes)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    count = number_in(AT_LEAST_1)  # 0 of any: no step timed
    parser.add_argument("--threads", type=count, default=torch.get_num_threads())
    parser.add_argument("--processes", type=count, default=1)
    parser.add_argument("--rounds", type=count, default=7)
    parser.add_argument("--steps", type=count, default=10)
    parser.add_argument("--batch-size", type=count, default=64)
    args = parser.parse_args(argv)
    if args.processes == 1:
        measure(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "init")
        torch.multiprocessing.spawn(_process, args=(args, init_file), nprocs=args.processes)


if __name__ == "__main__":
    _cli.run(main)
