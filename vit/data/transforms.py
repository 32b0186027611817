"""What a dataset's transform is: numpy RGB uint8 (H, W, 3) in, a (3, H, W) float tensor out.

`train_transform`: the albumentations training pipeline (crop, flip, RandAugment, erasing,
normalise), built from the model's `Preprocess` and the run's `AugmentConfig`.
`EvalTransform`: the model's evaluation preprocessing (resize, centre crop, normalise) on numpy
images: `vit.data.eval_transform`'s pipeline, the one `vit.create_transform` returns, so that
evaluate.py, predict and timm agree; `evaluation_images`: a few images of a dataset so prepared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image, ImageOps

from ..models.registry import Preprocess
from .datasets import CACHE_MAX_SIDE, load_split
from .eval_transform import eval_transform


class PILSharpness(A.ImageOnlyTransform):
    """PIL's `ImageEnhance.Sharpness` (torchvision's `adjust_sharpness`, the batch path's
    sharpness) on uint8 RGB images, at a factor drawn uniformly from `factor`: the image moved
    away from its SMOOTH-filtered self by that factor (1 leaves it as it is, above 1
    sharpens), the one-pixel border kept as PIL keeps it. Not `A.Sharpen`: at RandAugment's
    strengths that changes pixels ~10x as much, and its `lightness` darkens the image."""

    # PIL's ImageFilter.SMOOTH
    SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13

    def __init__(self, factor: tuple[float, float] = (1.2, 1.6), p: float = 0.5) -> None:
        super().__init__(p=p)
        self.factor = factor

    def get_params(self) -> dict[str, float]:
        # albumentations' generator, which the pipeline seeds per sample
        return {"factor": self.py_random.uniform(*self.factor)}

    def apply(self, img: np.ndarray, factor: float, **params) -> np.ndarray:
        image = img.astype(np.float32)
        smoothed = image.copy()  # (H, W, 3)
        smoothed[1:-1, 1:-1] = cv2.filter2D(image, -1, self.SMOOTH)[1:-1, 1:-1]
        sharpened = smoothed + factor * (image - smoothed)
        return np.clip(np.rint(sharpened), 0, 255).astype(np.uint8)


class PILEqualize(A.ImageOnlyTransform):
    """PIL's `ImageOps.equalize` (torchvision's, the batch path's) on uint8 RGB images.
    `A.Equalize` is OpenCV's equalisation by default (tens of levels from PIL's), and its
    mode="pil" shifts PIL's lookup table by one level."""

    def apply(self, img: np.ndarray, **params) -> np.ndarray:
        return np.asarray(ImageOps.equalize(Image.fromarray(img)))


def randaugment_ops() -> list[A.BasicTransform]:
    """RandAugment's menu (Cubuk et al. 2020, magnitude ~9/30), each op applied fully when
    drawn: the batch path's 13 ops (`vit.data.batch_randaugment.OPS`, in its order) at its
    strengths, PIL's definitions to within a level, as the tests check op by op. Where the
    two differ: each op here ends in uint8, translations are by whole pixels (albumentations
    truncates the fraction of the size), and a rotation turns the other way for the same angle
    (the range is symmetric, so the distribution is the same)."""
    return [
        A.Affine(rotate=(-20, 20), p=1.0),
        A.Affine(shear={"x": (-15, 15), "y": (0, 0)}, p=1.0),
        A.Affine(shear={"x": (0, 0), "y": (-15, 15)}, p=1.0),
        A.Affine(translate_percent={"x": (-0.15, 0.15), "y": (0, 0)}, p=1.0),
        A.Affine(translate_percent={"x": (0, 0), "y": (-0.15, 0.15)}, p=1.0),
        A.ColorJitter(brightness=0.4, contrast=0, saturation=0, hue=0, p=1.0),
        A.ColorJitter(brightness=0, contrast=0.4, saturation=0, hue=0, p=1.0),
        A.ColorJitter(brightness=0, contrast=0, saturation=0.5, hue=0, p=1.0),
        PILSharpness(factor=(1.2, 1.6), p=1.0),
        A.Posterize(num_bits=(4, 6), p=1.0),
        A.Solarize(threshold_range=(0.5, 1.0), p=1.0),
        PILEqualize(p=1.0),
        A.AutoContrast(method="pil", p=1.0),  # the default method, "cdf", equalises
    ]


@dataclass
class AugmentConfig:
    """Training augmentation settings (the train.py flags of the same names)."""

    crop: str = "auto"  # "pad": pad 4 + random crop; "rrc": random resized crop; auto: by size
    rrc_scale: float = 0.08  # smallest area fraction of random resized crop
    crop_pad: int | None = None  # "pad"'s pixels a side (None: 1/8 of the size)
    crop_pad_mode: str = "constant"  # ... filled with black, or "reflect": the image mirrored
    hflip: float = 0.5
    aa: str = "randaug"  # "none" or "randaug"
    aa_n: int = 2  # ops drawn per image from the RandAugment menu (with replacement)
    reprob: float = 0.25  # random erasing probability


def crop_padding(pad: int | None, size: tuple[int, int], mode: str) -> int:
    """--crop-pad for images of `size` (H, W): `pad`, or 1/8 of the larger side where None.
    ValueError for a padding a reflection cannot fill (as large as the image)."""
    pad = max(size) // 8 if pad is None else pad
    if mode == "reflect" and pad >= min(size):
        raise ValueError(
            f"--crop-pad {pad} with --crop-pad-mode reflect needs images larger than the "
            f"padding, and the input is {size[0]}x{size[1]}; give a padding below {min(size)}"
        )
    return pad


def train_transform(preprocess: Preprocess, aug: AugmentConfig) -> A.Compose:
    """Albumentations training pipeline: crop, flip, RandAugment, erasing, normalise, tensor.

    Input: RGB uint8 (H, W, 3) of any size; output: float tensor (3, *preprocess.input_size).
    """
    h, w = preprocess.input_size
    crop = aug.crop if aug.crop != "auto" else ("pad" if max(h, w) <= CACHE_MAX_SIDE else "rrc")
    if crop == "pad":
        # The CIFAR standard: resize to the model size if needed, pad by 1/8, crop back.
        pad = crop_padding(aug.crop_pad, (h, w), aug.crop_pad_mode)
        # torch's "reflect" (the edge pixel not repeated) is OpenCV's REFLECT_101
        border = {"constant": cv2.BORDER_CONSTANT, "reflect": cv2.BORDER_REFLECT_101}
        ops = [
            A.Resize(h, w, interpolation=cv2.INTER_CUBIC),
            A.PadIfNeeded(h + 2 * pad, w + 2 * pad, border_mode=border[aug.crop_pad_mode], fill=0),
            A.RandomCrop(h, w),
        ]
    elif crop == "rrc":
        ops = [A.RandomResizedCrop(size=(h, w), scale=(aug.rrc_scale, 1.0), interpolation=2)]
    else:
        raise ValueError(f"crop must be 'auto', 'pad' or 'rrc', got {aug.crop!r}")
    if aug.hflip > 0:
        ops.append(A.HorizontalFlip(p=aug.hflip))
    if aug.aa == "randaug":
        if aug.aa_n > 0:
            # RandAugment's draw (timm's, torchvision's, the batch path's): aa_n ops drawn
            # uniformly with replacement, applied in the order drawn, which RandomOrder does
            # with replace=True. A.SomeOf sorts its draws into the menu's order.
            ops.append(A.RandomOrder(randaugment_ops(), n=aug.aa_n, replace=True, p=1.0))
    elif aug.aa != "none":
        raise ValueError(f"--aa must be 'none' or 'randaug', got {aug.aa!r}")
    if aug.reprob > 0:
        # Random erasing (Zhong et al. 2017): one box of 10-40% per side filled with noise.
        ops.append(
            A.CoarseDropout(
                num_holes_range=(1, 1),
                hole_height_range=(0.1, 0.4),
                hole_width_range=(0.1, 0.4),
                fill="random",
                p=aug.reprob,
            )
        )
    ops += [A.Normalize(mean=preprocess.mean, std=preprocess.std), ToTensorV2()]
    return A.Compose(ops)


class TrainTransform:
    """`train_transform` on PIL images (what `vit.create_transform(..., is_training=True)`
    returns): RGB PIL image in, augmented (3, H, W) float tensor out."""

    def __init__(self, preprocess: Preprocess, aug: AugmentConfig) -> None:
        self.preprocess = preprocess
        self.transform = train_transform(preprocess, aug)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.transform(image=np.asarray(image.convert("RGB")))["image"]  # (3, H, W)


class EvalTransform:
    """The model's evaluation preprocessing (resize, centre crop, normalise) on numpy images;
    the same torchvision pipeline as `vit.create_transform`, so timm's numbers reproduce."""

    def __init__(self, preprocess: Preprocess) -> None:
        self.preprocess = preprocess
        self.transform = eval_transform(preprocess)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        return self.transform(Image.fromarray(image))  # (3, H, W)


def evaluation_images(
    data: str,
    split: str,
    count: int,
    preprocess: Preprocess,
    data_root: str | Path = "data",
    download: bool = False,
) -> torch.Tensor:
    """`count` images (N, C, H, W) of `data`'s split ("cifar10", "cifar100" or an image folder),
    spread over the classes, prepared as the model's evaluation prepares them: calibration and
    benchmark batches for the inference paths. CIFAR is read from `data_root`, downloaded there
    only with `download`; nothing is cached."""
    dataset = load_split(
        data,
        split,
        data_root,
        download=download,
        cache=False,
        subset=count,
        transform=EvalTransform(preprocess),
    )
    return torch.stack([dataset[i][0] for i in range(len(dataset))])
