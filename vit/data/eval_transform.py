"""The model's evaluation preprocessing: resize, crop, tensor, normalise, as timm's eval
transform (`timm.data.transforms_imagenet_eval`) does it for each of its crop modes, so that
timm's numbers reproduce.

`vit.create_transform` returns this pipeline (PIL image in); `vit.data.transforms.EvalTransform`
wraps it for the numpy images of the training data. A module of its own, below both, so that
neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..models.registry import Preprocess


def eval_transform(preprocess: Preprocess) -> Callable:
    """The torchvision pipeline for `preprocess`: RGB PIL image in, (3, H, W) float tensor out.

    The scale size is input_size / crop_pct, each side floored. By `preprocess.crop_mode`:
    "center" resizes keeping the aspect ratio so that both sides reach the scale size (for a
    square scale size torchvision's shorter-side resize, as timm), "squash" resizes both sides
    to it, "border" keeps the ratio so that both fit inside it and pads with the mean colour;
    then the centre crop to input_size.
    """
    # Imported here: torchvision's import costs ~1.4 s (it loads torchvision.models and
    # torch._dynamo), which `import vit` and create_model should not pay.
    from torchvision import transforms as T

    height, width = preprocess.input_size
    interpolation = T.InterpolationMode(preprocess.interpolation)
    scale = (math.floor(height / preprocess.crop_pct), math.floor(width / preprocess.crop_pct))
    crop = T.CenterCrop((height, width))
    if preprocess.crop_mode == "squash":  # the aspect ratio is lost
        resize = [T.Resize(scale, interpolation=interpolation), crop]
    elif preprocess.crop_mode == "border":  # the whole image kept where crop_pct is 1
        fill = tuple(round(255 * value) for value in preprocess.mean)  # the mean colour
        pad = PadToCrop((height, width), fill)
        resize = [ResizeKeepRatio(scale, interpolation, longest=True), pad]
    elif scale[0] == scale[1]:
        # timm's "center" uses torchvision's shorter-side resize here, which truncates the
        # longer side where ResizeKeepRatio rounds it: a pixel apart on some images.
        resize = [T.Resize(scale[0], interpolation=interpolation), crop]
    else:
        resize = [ResizeKeepRatio(scale, interpolation), crop]
    return T.Compose([*resize, T.ToTensor(), T.Normalize(preprocess.mean, preprocess.std)])


@dataclass(frozen=True)
class ResizeKeepRatio:
    """Resize a PIL image by the one factor on both sides that brings one side to its target
    in `size` (H, W) and leaves the other at least its own (`longest`: at most its own), each
    side rounded, as timm's `ResizeKeepRatio`. A module-level class: data loader workers pickle
    the transform."""

    size: tuple[int, int]  # (H, W)
    interpolation: object  # a torchvision InterpolationMode
    longest: bool = False

    def __call__(self, image):
        from torchvision.transforms import functional as F

        width, height = image.size
        ratios = (height / self.size[0], width / self.size[1])  # > 1: that side shrinks
        ratio = max(ratios) if self.longest else min(ratios)
        return F.resize(image, [round(height / ratio), round(width / ratio)], self.interpolation)


@dataclass(frozen=True)
class PadToCrop:
    """Centre-crop a PIL image to `size` (H, W), first padding a side shorter than its crop
    with `fill` (one more pixel after than before where the padding is odd), as timm's
    `CenterCropOrPad`. torchvision's CenterCrop pads so too, but only with black."""

    size: tuple[int, int]  # (H, W)
    fill: tuple[int, ...]  # the colour, 0..255 per channel

    def __call__(self, image):
        from torchvision.transforms import functional as F

        width, height = image.size
        pad_h, pad_w = max(self.size[0] - height, 0), max(self.size[1] - width, 0)
        # (left, top, right, bottom)
        padding = [pad_w // 2, pad_h // 2, (pad_w + 1) // 2, (pad_h + 1) // 2]
        if pad_h or pad_w:
            image = F.pad(image, padding, fill=self.fill)
        return F.center_crop(image, list(self.size))
