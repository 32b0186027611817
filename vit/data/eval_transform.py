"""The model's evaluation preprocessing: resize, centre crop, tensor, normalise, as timm's eval
transform does it, so that timm's numbers reproduce.

`vit.create_transform` returns this pipeline (PIL image in); `vit.data.transforms.EvalTransform`
wraps it for the numpy images of the training data. A module of its own, below both, so that
neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..models.registry import Preprocess


def eval_transform(preprocess: Preprocess) -> Callable:
    """The torchvision pipeline for `preprocess`: RGB PIL image in, (3, H, W) float tensor out.

    The resize target is input_size / crop_pct (floored), on the shorter side for square inputs
    and on both sides otherwise, then the centre crop to input_size, as timm's eval transform.
    """
    # Imported here: torchvision's import costs ~1.4 s (it loads torchvision.models and
    # torch._dynamo), which `import vit` and create_model should not pay.
    from torchvision import transforms as T

    height, width = preprocess.input_size
    interpolation = T.InterpolationMode(preprocess.interpolation)
    if height == width:
        resize = math.floor(height / preprocess.crop_pct)
    else:
        resize = (math.floor(height / preprocess.crop_pct), math.floor(width / preprocess.crop_pct))
    return T.Compose(
        [
            T.Resize(resize, interpolation=interpolation),
            T.CenterCrop((height, width)),
            T.ToTensor(),
            T.Normalize(preprocess.mean, preprocess.std),
        ]
    )
