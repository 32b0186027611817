"""Repeated augmentation (Hoffer et al. 2020; DeiT; timm's RepeatAugSampler): each image of an
epoch's shuffle taken `repeats` times in a row, dealt to the processes in turn, each copy
augmented on its own; each process keeps as many samples as without repeats, so an epoch is of
1 / repeats of the images. An image's copies are consecutive in one process's stream (in one
batch where the batch size is a multiple of `repeats`); with as many processes as copies, each
holds one (DeiT's layout).

`deal_repeats` is the layout, shared by both training pipelines: the in-memory batches
(`vit.data.batch_pipeline`) and, through `RepeatAugSampler`, the per-image loader.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def deal_repeats(
    order: torch.Tensor, repeats: int, *, rank: int, world_size: int, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """order (N,) image indices -> this process's first `count` samples of the repeated order:
    (indices (count,), copy numbers (count,): which of its image's copies each one is)."""
    repeated = order.repeat_interleave(repeats)  # (N * repeats,): each image `repeats` in a row
    copy = torch.arange(len(repeated), device=order.device) % repeats
    return repeated[rank::world_size][:count], copy[rank::world_size][:count]


class RepeatAugSampler(Sampler):
    """The per-image loader's repeated augmentation: each epoch a shuffle of the `size` images
    (the same in every process, from (seed, epoch)), dealt as `deal_repeats` does. Yields
    (index, copy) pairs: `ImageDataset` draws each copy's own augmentation (its per-sample seeds
    would otherwise give every copy the same one)."""

    def __init__(self, size: int, *, repeats: int, num_replicas: int, rank: int, seed: int):
        self.size, self.repeats, self.seed = size, repeats, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size // self.num_replicas

    def __iter__(self) -> Iterator[tuple[int, int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)  # as DistributedSampler
        order = torch.randperm(self.size, generator=generator)
        mine, copy = deal_repeats(
            order, self.repeats, rank=self.rank, world_size=self.num_replicas, count=len(self)
        )
        return iter(zip(mine.tolist(), copy.tolist(), strict=True))
