"""The training loader the settings ask for: whole uint8 batches augmented in memory
(--batch-augment), or a DataLoader of per-image transforms in worker processes."""

from __future__ import annotations

import numpy as np
from torch.utils.data import DistributedSampler

from ..data.batch_pipeline import InMemoryBatches
from ..data.datasets import ImageDataset
from ..data.loaders import EpochDataLoader, init_worker
from ..models.registry import Preprocess
from ..utils.process_group import DistInfo
from .settings import TrainConfig


def build_train_loader(
    cfg: TrainConfig, train_set: ImageDataset, preprocess: Preprocess, info: DistInfo, pin: bool
) -> EpochDataLoader | InMemoryBatches:
    """Training batches: whole uint8 batches augmented in memory (--batch-augment), or a
    DataLoader running `train_set`'s own transform per image in worker processes."""
    if cfg.hflip_alternate and not cfg.batch_augment:
        raise ValueError("--hflip-alternate needs --batch-augment (it flips whole batches)")
    if cfg.batch_augment:  # InMemoryBatches checks the batch size against the data itself
        return in_memory_batches(cfg, train_set, preprocess, info)
    if cfg.progressive_size is not None:
        raise ValueError("--progressive-size needs --batch-augment (it resizes whole batches)")
    per_process = len(train_set) // info.world_size
    if per_process < cfg.batch_size:
        raise ValueError(
            f"--batch-size {cfg.batch_size} is larger than the {per_process} training images "
            f"each of the {info.world_size} process(es) gets; use a batch size <= {per_process}"
        )
    sampler = DistributedSampler(
        train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed
    )
    return EpochDataLoader(
        train_set,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        pin_memory=pin,
        worker_init_fn=init_worker,
        drop_last=True,  # equal-sized batches: DDP averages gradients over equal shares
    )


def in_memory_batches(
    cfg: TrainConfig, train_set: ImageDataset, preprocess: Preprocess, info: DistInfo
) -> InMemoryBatches:
    """--batch-augment: the decoded training images as one uint8 array, augmented per batch."""
    if cfg.aa != "none" or cfg.crop not in ("auto", "pad"):
        raise ValueError(
            f"--batch-augment does pad-and-crop, flips and random erasing only; got --aa "
            f"{cfg.aa} --crop {cfg.crop}: use --aa none --crop pad, or leave out --batch-augment"
        )
    if train_set.images is None:
        raise ValueError("--batch-augment keeps the images in memory: leave --cache on")
    if cfg.progressive_size is not None and cfg.progressive_size > preprocess.input_size[0]:
        raise ValueError(
            f"--progressive-size {cfg.progressive_size} is larger than the model's input size "
            f"{preprocess.input_size[0]}, which the image size grows to; give a smaller size"
        )
    shapes = {image.shape for image in train_set.images}
    if len(shapes) != 1 or next(iter(shapes))[:2] != tuple(preprocess.input_size):
        raise ValueError(
            f"--batch-augment needs every training image at the model's input size "
            f"{tuple(preprocess.input_size)}; {cfg.data} has sizes {sorted(shapes)[:5]}"
        )
    return InMemoryBatches(
        np.stack(train_set.images) if isinstance(train_set.images, list) else train_set.images,
        train_set.labels,
        batch_size=cfg.batch_size,
        mean=preprocess.mean,
        std=preprocess.std,
        pad=preprocess.input_size[0] // 8,  # the CIFAR standard: 4 pixels on 32
        hflip=cfg.hflip,
        hflip_alternate=cfg.hflip_alternate,
        reprob=cfg.reprob,
        seed=cfg.seed,
        rank=info.rank,
        world_size=info.world_size,
    )
