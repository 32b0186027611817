"""From datasets to batches: the epoch-aware training DataLoader and the evaluation loader, each
process taking its own share (`vit.training.train_loader` picks the training loader).

Both training loaders have `set_epoch(epoch, size)`: a new shuffle and new augmentations each
epoch, reproducible from (seed, epoch), so a resumed run draws the batches of an uninterrupted
one. `size` is the epoch's image size under progressive resizing (in-memory batches only).
"""

from __future__ import annotations

import signal

import torch
from torch.utils.data import DataLoader, Sampler, Subset

from ..utils.process_group import DistInfo
from .datasets import ImageDataset


class EpochDataLoader(DataLoader):
    """A DataLoader over a DistributedSampler, with InMemoryBatches' `set_epoch`."""

    def set_epoch(self, epoch: int, size: int | None = None) -> None:
        self.sampler.set_epoch(epoch)  # the shuffle
        self.dataset.set_epoch(epoch)  # the per-sample augmentation seeds


class RepeatAugSampler(Sampler):
    """Repeated augmentation for the per-image loader, in the layout of timm's sampler of that
    name: each epoch a shuffle of the `size` images (the same in every process, from (seed,
    epoch)), each image `repeats` times in a row, dealt to the processes in turn; each process
    takes size // num_replicas of them, so an epoch is as many samples as without repeats, of
    size / repeats images. Yields (index, copy) pairs: `ImageDataset` draws each copy's own
    augmentation (its per-sample seeds would otherwise give every copy the same one)."""

    def __init__(self, size: int, *, repeats: int, num_replicas: int, rank: int, seed: int):
        self.size, self.repeats, self.seed = size, repeats, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size // self.num_replicas

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)  # as DistributedSampler
        order = torch.randperm(self.size, generator=generator).repeat_interleave(self.repeats)
        copy = torch.arange(len(order)) % self.repeats  # which copy of its image each one is
        mine = order[self.rank :: self.num_replicas][: len(self)]
        my_copy = copy[self.rank :: self.num_replicas][: len(self)]
        return iter(zip(mine.tolist(), my_copy.tolist(), strict=True))


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
    )
