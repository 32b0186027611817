"""One name per output of a model, the same in every command."""

from __future__ import annotations

from .vision_transformer import VisionTransformer


def class_names_for(model: VisionTransformer) -> list[str]:
    """One name per output, the same in every command: the names stored with the weights;
    for a 1000-class head without them, ImageNet-1k's human-readable labels ("tench, Tinca
    tinca", timm's `ImageNetInfo`); otherwise "class 0", "class 1", ..."""
    names = getattr(model, "class_names", None)
    if names:
        return list(names)
    if model.num_classes == 1000:
        from timm.data import ImageNetInfo  # ships with timm: no download

        info = ImageNetInfo()
        return [info.index_to_description(i) for i in range(1000)]
    return [f"class {i}" for i in range(model.num_classes)]
