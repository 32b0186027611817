"""DistributedDataParallel plumbing: one process per device, launched by torchrun.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `from_env` reads them
once at the command-line edge and `setup` joins the process group (NCCL on GPUs, gloo on CPU).

A start that fails on one process must stop them all, each at once and the same way, instead
of leaving the others waiting for it in a collective: `rank0_first`, `failing_together`;
Ctrl-C stops them all too: `stop_on_interrupt`. A process that ends (killed) breaks the others'
collectives, which then have nothing to add: `peer_gone`. `python -m vit.distributed`
(vit/distributed.py) starts the processes.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from .signals import handled

T = TypeVar("T")


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
        if device.index is None:  # set_device needs an index: each process its own GPU
            index = info.local_rank if info.enabled else torch.cuda.current_device()
            device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {name}: Apple's MPS is not available here; use --device cpu")
    elif device.type not in ("cpu", "mps"):
        raise ValueError(
            f"--device {name}: not a device this package runs on; accepted: auto, "
            "cpu, cuda, cuda:N, mps"
        )
    return device


def setup(info: DistInfo, device: torch.device) -> None:
    """Join the process group (no-op for a single process)."""
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size)
        # DistributedDataParallel sits in reference cycles: the cycle collector frees it when
        # it next runs, which may be the interpreter's own teardown, where C++ threads can no
        # longer take the GIL and the process aborted ("terminate called without an active
        # exception", SIGABRT: 7 exits in 100 of two gloo processes, Python 3.11, torch 2.14).
        # Collected at exit, while the interpreter is whole, it did not (0 in 100).
        atexit.register(gc.collect)


def distributed(module: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    """`module` DDP-wrapped under torchrun (its gradients averaged over the processes), else as
    it is."""
    if not info.enabled:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids)


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


def broadcast_from_rank0(info: DistInfo, value: T) -> T:
    """Rank 0's `value` (any picklable object) on every process; `value` itself without a
    process group."""
    if not _joined(info):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# -- a start that fails on one process stops them all --------------------------------------------
class PeerFailedError(ValueError):
    """Another process's start failed; its message, for rank 0 to print."""


def _joined(info: DistInfo) -> bool:
    return info.enabled and dist.is_available() and dist.is_initialized()


def rank0_first(info: DistInfo, step: Callable[[], T], errors: tuple[type[Exception], ...]) -> T:
    """`step()` on rank 0, then, once it succeeded, on the other processes (a download or a
    cache is written once). If it fails on rank 0 with one of `errors`, every process raises:
    rank 0 its error, the others a PeerFailedError with its message."""
    if not _joined(info):
        return step()
    outcome: list[str | None] = [None]  # rank 0's error message, sent to the others
    error = None
    if info.is_main:
        try:
            result = step()
        except errors as e:
            error, outcome[0] = e, str(e)
    dist.broadcast_object_list(outcome, src=0)
    if error is not None:
        raise error
    if outcome[0] is not None:
        raise PeerFailedError(outcome[0])
    return result if info.is_main else step()


@contextmanager
def failing_together(info: DistInfo, errors: tuple[type[Exception], ...]) -> Iterator[None]:
    """Run a block on every process, then tell the others whether it failed with one of
    `errors`; if it failed anywhere, each process raises: its own error, or a PeerFailedError
    with the message of the lowest failed rank (for rank 0 to print)."""
    try:
        yield
    except errors as e:
        _gather_failures(info, str(e))
        raise
    failed = _gather_failures(info, None)
    if failed is not None:
        raise PeerFailedError(failed)


def _gather_failures(info: DistInfo, message: str | None) -> str | None:
    """The first failure message of all processes (`message` is this one's), or None."""
    if not _joined(info):
        return message
    messages: list[str | None] = [None] * info.world_size
    dist.all_gather_object(messages, message)
    return next((m for m in messages if m is not None), None)


# -- another process's end -----------------------------------------------------------------------
# What gloo's collectives say once another process has ended (killed, or out on its own error):
# the connection to it closed, was reset, or refused a write.
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe")


def peer_gone(error: BaseException) -> bool:
    """Whether `error` is a collective broken by another process's end, which torchrun (or that
    process, of its own error) reports: not a failure of this one. (NCCL's collectives wait
    instead, until torchrun ends this process.)"""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(words in text for words in PEER_GONE)


# -- Ctrl-C --------------------------------------------------------------------------------------
_interrupted = False
_stopped_by = signal.SIGINT  # what stopped the run: Ctrl-C, or (one process) SIGTERM


@contextmanager
def stop_on_interrupt(info: DistInfo) -> Iterator[None]:
    """Within the block, Ctrl-C (SIGINT; torchrun passes it on to every process) stops rank 0
    at once, with a KeyboardInterrupt. The other processes only note it and go on until rank
    0 has left, so that rank 0 never finds a collective broken by another process that left
    first; they stop at their next collective, whose error `interrupted()` then explains.

    A process alone stops so on SIGTERM too (`kill`, a scheduler's end of a job, `docker
    stop`): it closes the run's files and says where to continue, where the default end could
    leave the temporary file of a checkpoint being written beside them. Under torchrun, SIGTERM
    keeps its default: it is torchrun's own way of ending the others once a process failed."""
    global _interrupted, _stopped_by
    _interrupted, _stopped_by = False, signal.SIGINT

    def note(signum: int, frame) -> None:
        global _interrupted, _stopped_by
        first, _interrupted = not _interrupted, True
        if first:
            _stopped_by = signal.Signals(signum)
        if info.is_main and first:  # a second Ctrl-C must not break the way out of the first
            raise KeyboardInterrupt

    signals = (signal.SIGINT,) if info.enabled else (signal.SIGINT, signal.SIGTERM)
    with handled(signals, note):
        yield
    # a Ctrl-C after the block's last check, whose exception Python swallowed where it landed
    # (see stop_if_interrupted), stops the process all the same
    stop_if_interrupted(info)


def stopped_by() -> signal.Signals:
    """The signal that stopped the run, once `interrupted()`: SIGINT or SIGTERM."""
    return _stopped_by


def interrupted() -> bool:
    """Whether Ctrl-C reached this process (a function call: a signal handler still pending,
    behind a collective that just failed, runs before the answer)."""
    return _interrupted


def stop_if_interrupted(info: DistInfo) -> None:
    """On rank 0, raise the KeyboardInterrupt of a Ctrl-C already noted. The handler raises it
    once, where the signal lands; if that is code whose exceptions Python swallows (a `__del__`
    or a weakref callback: "Exception ignored in ..."), the run would train on and a second
    Ctrl-C would be ignored. The training loop calls this between steps."""
    if info.is_main and _interrupted:
        raise KeyboardInterrupt
