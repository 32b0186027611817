"""The loaders the settings ask for: whole uint8 batches augmented in memory on the training
device (--batch-augment), or a DataLoader of per-image transforms in worker processes; and for
the test images, in-memory batches on the device where the evaluation transform only
normalises them, else a DataLoader."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from ..data.batch_pipeline import InMemoryBatches, InMemoryEvalBatches
from ..data.datasets import ImageDataset
from ..data.loaders import EpochDataLoader, eval_loader, init_worker
from ..data.repeated_augmentation import RepeatAugSampler
from ..data.transforms import crop_padding
from ..models.registry import Preprocess
from ..utils.process_group import DistInfo
from .settings import TrainConfig

# Test images per batch when they are evaluated on a GPU from memory: the model's evaluation
# is a few large launches, not 80 of a training batch's size.
GPU_EVAL_BATCH = 1024


def build_train_loader(
    cfg: TrainConfig,
    train_set: ImageDataset,
    preprocess: Preprocess,
    info: DistInfo,
    device: torch.device,
) -> EpochDataLoader | InMemoryBatches:
    """Training batches: whole uint8 batches augmented in memory on `device` (--batch-augment),
    or a DataLoader running `train_set`'s own transform per image in worker processes."""
    if cfg.hflip_alternate and not cfg.batch_augment:
        raise ValueError("--hflip-alternate needs --batch-augment (it flips whole batches)")
    if cfg.augment_batches > 1 and not cfg.batch_augment:
        raise ValueError(
            f"--augment-batches {cfg.augment_batches} needs --batch-augment (it augments whole "
            f"batches in memory); add --batch-augment, or leave out --augment-batches"
        )
    if cfg.batch_augment:  # InMemoryBatches checks the batch size against the data itself
        return in_memory_batches(cfg, train_set, preprocess, info, device)
    if cfg.progressive_size is not None:
        raise ValueError("--progressive-size needs --batch-augment (it resizes whole batches)")
    per_process = len(train_set) // info.world_size
    if per_process < cfg.batch_size:
        raise ValueError(
            f"--batch-size {cfg.batch_size} is larger than the {per_process} training images "
            f"each of the {info.world_size} process(es) gets; use a batch size <= {per_process}"
        )
    if cfg.aug_repeats > 1:
        sampler = RepeatAugSampler(
            len(train_set),
            repeats=cfg.aug_repeats,
            num_replicas=info.world_size,
            rank=info.rank,
            seed=cfg.seed,
        )
    else:
        sampler = DistributedSampler(
            train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed
        )
    return EpochDataLoader(
        train_set,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        pin_memory=device.type == "cuda",
        worker_init_fn=init_worker,
        drop_last=True,  # equal-sized batches: DDP averages gradients over equal shares
    )


def in_memory_batches(
    cfg: TrainConfig,
    train_set: ImageDataset,
    preprocess: Preprocess,
    info: DistInfo,
    device: torch.device,
) -> InMemoryBatches:
    """--batch-augment: the decoded training images as one uint8 tensor on `device`, augmented
    per batch there."""
    if cfg.crop not in ("auto", "pad"):
        raise ValueError(
            f"--batch-augment does pad-and-crop, flips, RandAugment and random erasing; got "
            f"--crop {cfg.crop}: use --crop pad, or leave out --batch-augment"
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
            f"--batch-augment (the recipe's, a config's or the flag's) needs every training image "
            f"at the model's input size {tuple(preprocess.input_size)}; {cfg.data} has sizes "
            f"{sorted(shapes)[:5]}: add --no-batch-augment (each image prepared alone, any size)"
        )
    return InMemoryBatches(
        np.stack(train_set.images) if isinstance(train_set.images, list) else train_set.images,
        train_set.labels,
        batch_size=cfg.batch_size,
        mean=preprocess.mean,
        std=preprocess.std,
        pad=crop_padding(cfg.crop_pad, preprocess.input_size, cfg.crop_pad_mode),
        pad_mode=cfg.crop_pad_mode,
        hflip=cfg.hflip,
        hflip_alternate=cfg.hflip_alternate,
        randaug_ops=cfg.aa_n if cfg.aa == "randaug" else 0,
        reprob=cfg.reprob,
        aug_repeats=cfg.aug_repeats,
        seed=cfg.seed,
        rank=info.rank,
        world_size=info.world_size,
        device=device,
        compile_randaug=cfg.compile,
        augment_batches=cfg.augment_batches,
    )


def build_test_loader(
    cfg: TrainConfig,
    test_set: ImageDataset,
    preprocess: Preprocess,
    info: DistInfo,
    device: torch.device,
) -> DataLoader | InMemoryEvalBatches:
    """The test batches: from memory on `device` with --batch-augment when the images are at
    the model's input size and the evaluation transform's resize keeps them so (it then only
    normalises: the same values); else a DataLoader of `test_set`'s own transform."""
    if cfg.batch_augment and only_normalised(test_set, preprocess):
        return InMemoryEvalBatches(
            np.stack(test_set.images) if isinstance(test_set.images, list) else test_set.images,
            test_set.labels,
            batch_size=GPU_EVAL_BATCH if device.type == "cuda" else cfg.batch_size,
            mean=preprocess.mean,
            std=preprocess.std,
            rank=info.rank,
            world_size=info.world_size,
            device=device,
        )
    pin = device.type == "cuda"
    return eval_loader(test_set, batch_size=cfg.batch_size, workers=cfg.workers, info=info, pin=pin)


def only_normalised(test_set: ImageDataset, preprocess: Preprocess) -> bool:
    """Whether the evaluation transform leaves every (decoded, in-memory) test image's pixels
    as they are: every image at the input size, and a scale size, input_size / crop_pct
    (floored), that is the input size again; then every crop_mode's resize keeps the image's
    size (torchvision returns it untouched) and its crop or padding is none."""
    if test_set.images is None or len(test_set) == 0:
        return False
    height, width = preprocess.input_size
    unresized = all(
        math.floor(side / preprocess.crop_pct) == side for side in preprocess.input_size
    )
    return unresized and all(image.shape == (height, width, 3) for image in test_set.images)
