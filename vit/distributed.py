"""DistributedDataParallel plumbing: one process per device, launched by torchrun.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `from_env` reads them
once at the command-line edge and `setup` joins the process group (NCCL on GPUs, gloo on CPU).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """Where this process sits: rank among world_size processes, its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, plots and writes files."""
        return self.rank == 0


def from_env(env: Mapping[str, str] | None = None) -> DistInfo:
    """The torchrun environment variables, or a single process when they are absent."""
    env = os.environ if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return DistInfo()
    return DistInfo(
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
    )


def resolve_device(name: str, info: DistInfo) -> torch.device:
    """'auto' -> CUDA if available, else CPU; with several processes each takes its GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"--device {name}: not a device; accepted: auto, cpu, cuda, cuda:N, mps"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available here; use --device cpu")
        if info.enabled and device.index is None:
            device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    return device


def setup(info: DistInfo, device: torch.device) -> None:
    """Join the process group (no-op for a single process)."""
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size)


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes (in place; unchanged for a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
