"""Datasets: CIFAR and image folders, each made with its transform.

Data flows one way: files (or torchvision's CIFAR arrays) -> `load_split` -> `ImageDataset`
(numpy HWC uint8 RGB images, decoded by `vit.data.images.load_image`, optionally once into memory)
-> its transform, given when the dataset is made (`vit.data.transforms`) -> (C, H, W) float tensors
-> loader -> `vit.data.mixup.MixupCutmix` on the batch.

Augmentation randomness is seeded per sample from (seed, epoch, index), so an epoch's images
are the same whatever the number of loader workers or processes, and a resumed run sees the
same augmentations as an uninterrupted one; `set_epoch` moves to the next epoch's draws.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import albumentations as A
import numpy as np
from torch.utils.data import Dataset

from ..utils.files import atomic_write
from .images import (
    IMAGE_EXTENSIONS,
    CorruptImageError,
    images_in_folder,
    load_image,
    load_images,
)
from .workers import usable_cores

logger = logging.getLogger("vit")

__all__ = ["CorruptImageError", "ImageDataset", "load_image", "load_split"]

TORCHVISION_DATASETS = ("cifar10", "cifar100")
TEST_SPLITS = ("test", "val")
# Images at most this many pixels on a side are cached decoded in memory by default
# (CIFAR: 50,000 x 32 x 32 x 3 = 150 MB); larger ones are decoded on the fly.
CACHE_MAX_SIDE = 64


class ImageDataset(Dataset):
    """Labelled images as numpy HWC uint8, from files (decoded lazily or cached) or arrays.

    `transform(image)` -> tensor is applied in `__getitem__`; an albumentations transform gets
    a random state seeded from (seed, epoch, index) first. Call `set_epoch` before each epoch.
    Without a transform, items are the raw (H, W, 3) uint8 images.
    """

    def __init__(
        self,
        labels: Sequence[int],
        class_names: list[str],
        paths: Sequence[Path] | None = None,
        images: np.ndarray | list[np.ndarray] | None = None,
        transform: Callable | None = None,
        seed: int = 0,
    ) -> None:
        if (paths is None) == (images is None):
            raise ValueError("give exactly one of paths (image files) or images (arrays)")
        self.paths = list(paths) if paths is not None else None
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.class_names = list(class_names)
        self.transform = transform
        self.seed = seed
        self.epoch = 0
        if len(self.labels) != (len(self.paths) if self.paths is not None else len(images)):
            raise ValueError("as many labels as images are needed")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def set_epoch(self, epoch: int) -> None:
        """Draw the augmentations of `epoch` from now on."""
        self.epoch = epoch

    def cache(self, workers: int | None = None, cache_dir: Path | None = None) -> ImageDataset:
        """Decode every file once into memory, on `workers` cores (`images.load_images`), by
        default every core this process may use, at most 32.

        With `cache_dir`, images of one size are also kept there as one .npy array, named by a
        hash of the files' paths, sizes and modification times: the next run reads it in a
        fraction of a second instead of decoding again, and a changed file is decoded anew.
        """
        if self.images is not None:
            return self
        stored = cache_dir / f"decoded-{files_digest(self.paths)}.npy" if cache_dir else None
        if stored is not None and stored.is_file():
            self.images = np.load(stored)
            if len(self.images) == len(self.paths):
                return self
        workers = workers or min(32, usable_cores())
        start = time.perf_counter()
        self.images = load_images(self.paths, workers)
        # a bare machine's start decodes every image: the log says what it cost
        logger.info(
            "decoded %d images in %.1f s (%d workers)",
            len(self.images),
            time.perf_counter() - start,
            workers,
        )
        if stored is not None and len({image.shape for image in self.images}) == 1:
            self.images = np.stack(self.images)  # (N, H, W, 3) uint8
            try:  # a time-saver for the next run: one that cannot be kept costs this run nothing
                stored.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(stored, self._save_images)
            except OSError as e:
                logger.warning("the decoded images were not kept for the next run: %s", e)
        return self

    def _save_images(self, path: Path) -> None:
        with open(path, "wb") as f:  # a file object: np.save would append .npy to a name
            np.save(f, self.images, allow_pickle=False)

    def _derive(self, indices: Sequence[int] | None = None, **changes) -> ImageDataset:
        """A new dataset over the same images (or those at `indices`) with `changes` to its
        arguments; decoded images are shared, not copied."""
        keep = np.arange(len(self)) if indices is None else list(indices)
        images = self.images
        if images is not None and indices is not None:
            images = [images[i] for i in keep]
        arguments = {
            "labels": self.labels[keep],
            "class_names": self.class_names,
            "paths": None if self.paths is None else [self.paths[i] for i in keep],
            "images": images if self.paths is None else None,
            "transform": self.transform,
            "seed": self.seed,
        }
        derived = ImageDataset(**{**arguments, **changes})
        derived.images = images  # a file dataset's decoded cache too
        return derived

    def subset(self, indices: Sequence[int]) -> ImageDataset:
        """A new dataset with the given samples (same classes, transform and seed)."""
        return self._derive(indices)

    def with_transform(self, transform: Callable | None, seed: int | None = None) -> ImageDataset:
        """The same images with another transform (and augmentation seed)."""
        return self._derive(transform=transform, seed=self.seed if seed is None else seed)

    def relabel(self, mapping: Sequence[int], class_names: list[str]) -> ImageDataset:
        """The same images labelled in another class space: class i becomes `mapping[i]`, an
        index into `class_names` (e.g. a model's classes, in its output order)."""
        labels = np.asarray(mapping, dtype=np.int64)[self.labels]
        return self._derive(labels=labels, class_names=class_names)

    def image(self, index: int) -> np.ndarray:
        """The raw image (H, W, 3) uint8."""
        if self.images is not None:
            return self.images[index]
        return load_image(self.paths[index])

    def __getitem__(self, index: int | tuple[int, int]):
        """index: an image's position, or (position, copy) from
        `vit.data.repeated_augmentation.RepeatAugSampler`, whose copies of one image each draw
        their own augmentation."""
        index, copy = index if isinstance(index, tuple) else (index, 0)
        image = self.image(index)
        if self.transform is None:
            return image, int(self.labels[index])
        if isinstance(self.transform, A.BaseCompose):
            # One seed per (run seed, epoch, sample): the same augmentation whichever worker
            # or process draws the sample, and again after a resume.
            sample = (index,) if copy == 0 else (index, copy)  # copy 0: the draws of old
            sample_seed = hash((self.seed, self.epoch, *sample)) & 0x7FFF_FFFF_FFFF_FFFF
            self.transform.set_random_state(
                np.random.default_rng(sample_seed), random.Random(sample_seed)
            )
            tensor = self.transform(image=image)["image"]
        else:
            tensor = self.transform(image)
        return tensor, int(self.labels[index])


def files_digest(paths: Sequence[Path]) -> str:
    """A hash of the files' absolute paths, sizes and modification times, in order. A name
    that is not UTF-8 (Python's surrogate escapes) counts as its bytes."""
    digest = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        line = f"{os.path.abspath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
        digest.update(line.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


# -- finding the data ----------------------------------------------------------------------------
def scan_folder(root: Path) -> tuple[list[Path], list[int], list[str]]:
    """An image-folder split (root/<class>/<image>) -> (paths, labels, sorted class names)."""
    if not root.is_dir():
        raise FileNotFoundError(f"image folder split not found: {root}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"{root} has no class folders; expected {root}/<class name>/<image files>")
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = images_in_folder(root / name)
        if not files:
            raise ValueError(
                f"class folder {root / name} holds no images (accepted extensions: "
                f"{', '.join(IMAGE_EXTENSIONS)})"
            )
        paths += files
        labels += [label] * len(files)
    return paths, labels, classes


def find_split_dir(root: Path, split: str) -> Path:
    """root/train, or for the test split root/test or else root/val."""
    candidates = ("train",) if split == "train" else TEST_SPLITS
    for name in candidates:
        if (root / name).is_dir():
            return root / name
    raise FileNotFoundError(
        f"{root} has no {' or '.join(candidates)}/ subfolder; an image-folder dataset needs "
        f"{root}/train/<class>/<images> and {root}/test/<class>/<images> (or val/)"
    )


def _torchvision_split(
    name: str, root: Path, train: bool, download: bool, **dataset
) -> ImageDataset:
    """CIFAR-10/100 through torchvision (downloaded into `root` when missing); `dataset`: more
    ImageDataset arguments."""
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    made = first_missing_folder(root)
    try:
        ds = cls(root=str(root), train=train, download=download)
    except (RuntimeError, OSError) as e:  # not found / corrupted; URLError when offline
        if made is not None and made.is_dir():
            shutil.rmtree(made)  # what the failed download made: nothing of the user's
        if not download:  # torchvision's "You can use download=True" is no news to the caller
            raise FileNotFoundError(
                f"{name} is not in {root} (no complete copy there), and downloading it is off"
            ) from e
        raise FileNotFoundError(
            f"{name} is not in {root} and could not be downloaded ({e}); run once with "
            f"internet access, or pass --data a folder with train/ and test/ subfolders"
        ) from e
    return ImageDataset(ds.targets, ds.classes, images=ds.data, **dataset)  # (N, 32, 32, 3) uint8


def first_missing_folder(path: Path) -> Path | None:
    """The first folder of `path` (itself included) that does not exist yet: what a download
    into `path` would make, and what removing it after a failed download takes away."""
    return next((p for p in [*reversed(path.parents), path] if not p.exists()), None)


def stratified_indices(labels: np.ndarray, count: int, seed: int) -> list[int]:
    """`count` sample indices (all of them, where there are fewer) spread evenly over the
    classes, chosen at random by `seed`."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == c) for c in classes]
    # an even share each (the first count % C one more), at most the class's images; what small
    # classes cannot give goes, one at a time, to the classes that have more (it was left out)
    sizes = [
        min(count // len(classes) + (i < count % len(classes)), len(m))
        for i, m in enumerate(members)
    ]
    left = min(count, len(labels)) - sum(sizes)
    while left > 0:
        for i, m in enumerate(members):
            if left > 0 and sizes[i] < len(m):
                sizes[i], left = sizes[i] + 1, left - 1
    chosen = []
    for m, size in zip(members, sizes, strict=True):
        chosen += rng.choice(m, size=size, replace=False).tolist()
    return sorted(chosen)


def load_split(
    data: str,
    split: str,
    data_root: str | Path = "data",
    download: bool = True,
    cache: bool | None = None,
    subset: int | None = None,
    seed: int = 0,
    cache_dir: Path | None = None,
    transform: Callable | None = None,
) -> ImageDataset:
    """The train or test split of `data` ("cifar10", "cifar100" or an image-folder path).

    transform: what the dataset applies to each image (see `vit.data.transforms`); None: raw images.
    seed: picks the subset, and seeds the transform's augmentation (see `ImageDataset`).

    cache: decode the images once into memory; None caches images of at most
        CACHE_MAX_SIDE pixels per side (judged from the first image).
    subset: keep only this many samples, stratified by class (quick runs and tests).
    cache_dir: keep decoded images there between runs (see `ImageDataset.cache`).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if data.lower() in TORCHVISION_DATASETS:
        ds = _torchvision_split(
            data.lower(),
            Path(data_root),
            split == "train",
            download,
            transform=transform,
            seed=seed,
        )
    else:
        root = Path(data)
        if not root.is_dir():
            raise FileNotFoundError(
                f"{data!r} is neither one of {', '.join(TORCHVISION_DATASETS)} nor an "
                f"existing folder with train/ and test/ (or val/) subfolders of class folders"
            )
        paths, labels, classes = scan_folder(find_split_dir(root, split))
        ds = ImageDataset(labels, classes, paths=paths, transform=transform, seed=seed)
    if subset is not None and subset < len(ds):
        ds = ds.subset(stratified_indices(ds.labels, subset, seed))
    if ds.paths is not None:
        if cache is None:
            cache = max(load_image(ds.paths[0]).shape[:2]) <= CACHE_MAX_SIDE
        if cache:
            ds.cache(cache_dir=cache_dir)
    return ds


# -- MixUp / CutMix ------------------------------------------------------------------------------
