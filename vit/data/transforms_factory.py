"""`create_transform`: the eval (or training) transform of a model, a name or a data config."""

from __future__ import annotations

from collections.abc import Callable

from ..models.registry import Preprocess, get_spec
from ..models.vision_transformer import VisionTransformer


def create_transform(
    preprocess: Preprocess | str | dict | VisionTransformer,
    is_training: bool = False,
    aug=None,
) -> Callable:
    """The transform for a PIL image, from a `Preprocess`, a model name ("vit_base_patch16_224",
    with an optional ".tag"), a model (its `preprocess`), or a timm data config dict
    (`input_size` (C, H, W), `mean`, `std`, `interpolation`, `crop_pct`, and `crop_mode`:
    "center" where it is missing or None, as timm).

    Evaluation (the default): resize, centre crop, tensor, normalise, as timm's eval transform
    for the preprocessing's crop_mode (`vit.data.eval_transform`): "center" resizes keeping the
    aspect ratio until both sides reach input_size / crop_pct (floored), "squash" resizes both
    sides to it, "border" keeps the ratio to fit inside it and pads with the mean colour.
    is_training: the project's training augmentation instead (`vit.data.transforms.train_transform`:
    crop, flip, RandAugment, random erasing, normalise) with `aug` (a
    `vit.data.transforms.AugmentConfig`, its defaults if None); random on every call.
    """
    preprocess = _as_preprocess(preprocess)
    if is_training:
        # Imported here: albumentations and OpenCV, which the training pipeline needs, are
        # not needed to build or run a model.
        from .transforms import AugmentConfig, TrainTransform

        return TrainTransform(preprocess, aug or AugmentConfig())
    from .eval_transform import eval_transform

    return eval_transform(preprocess)


def _as_preprocess(source) -> Preprocess:
    if isinstance(source, Preprocess):
        return source
    if isinstance(source, str):
        return get_spec(source).preprocess
    if isinstance(source, VisionTransformer):
        if source.preprocess is None:
            raise ValueError("this model has no preprocess; build it with vit.create_model")
        return source.preprocess
    if isinstance(source, dict):
        keys = ("input_size", "mean", "std", "interpolation", "crop_pct")
        missing = [k for k in keys if k not in source]
        if missing:
            raise ValueError(f"data config lacks {missing}; a timm data config has {list(keys)}")
        values = {k: source[k] for k in keys}
        values["input_size"] = tuple(values["input_size"])[-2:]  # timm's is (C, H, W)
        values["crop_mode"] = source.get("crop_mode") or "center"  # timm's default for None
        return Preprocess.from_dict(values)
    raise TypeError(
        f"create_transform takes a Preprocess, a model name, a model or a timm data config "
        f"dict, got a {type(source).__name__}"
    )
