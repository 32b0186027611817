"""From datasets to batches: the epoch-aware training DataLoader and the evaluation loader, each
process taking its own share (`vit.training.train_loader` picks the training loader).

Both training loaders have `set_epoch(epoch, size)`: a new shuffle and new augmentations each
epoch, reproducible from (seed, epoch), so a resumed run draws the batches of an uninterrupted
one. `size` is the epoch's image size under progressive resizing (in-memory batches only).
"""

from __future__ import annotations

import signal

import torch
from torch.utils.data import DataLoader, Subset

from ..utils.process_group import DistInfo
from .datasets import ImageDataset


class EpochDataLoader(DataLoader):
    """A DataLoader over a DistributedSampler, with InMemoryBatches' `set_epoch`."""

    def set_epoch(self, epoch: int, size: int | None = None) -> None:
        self.sampler.set_epoch(epoch)  # the shuffle
        self.dataset.set_epoch(epoch)  # the per-sample augmentation seeds


def init_worker(worker_id: int) -> None:
    """Each loader worker process, as it starts: Ctrl-C is left to the main process, which
    stops the workers itself and prints one line (a worker killed by the terminal's SIGINT
    makes the pin-memory thread print a traceback). OpenCV's threads are left alone: setting
    them in a forked worker can deadlock on a lock the parent's pool held at the fork, and one
    thread per worker ran level with the default anyway (benchmarks/loader_throughput.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def eval_loader(
    dataset: ImageDataset, batch_size: int, workers: int, info: DistInfo, pin: bool
) -> DataLoader:
    """Each process takes every world_size-th image (no padding, so no image counts twice)."""
    if info.enabled:
        dataset = Subset(dataset, range(info.rank, len(dataset), info.world_size))
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin,
        worker_init_fn=init_worker,
        # Each pass draws its workers' base seed from this generator, not torch's global one,
        # which stochastic depth and the mixing draw from: how often a run evaluates then
        # changes nothing it learns. The evaluation's transforms draw nothing themselves.
        generator=torch.Generator(),
    )
