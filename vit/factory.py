"""Building models by name, with or without pretrained weights, and their eval transforms."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from torchvision import transforms as T

from .configs import Preprocess, get_spec
from .model import VisionTransformer, ViTConfig, to_pair
from .weights import load_weights, read_metadata


def create_model(
    name: str,
    pretrained: bool | str | Path = False,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    **overrides,
) -> VisionTransformer:
    """Build a named ViT, e.g. `create_model("vit_base_patch16_224", pretrained=True)`.

    pretrained: False for fresh initialisation; True for timm's default pretrained weights for
        this name (downloaded through timm from the Hugging Face hub); or a weights file path
        (see `vit.load_weights` for the formats).
    num_classes: replace the classifier (a pretrained head of another size is dropped).
    img_size: another input size; pretrained position embeddings are resampled to it.
    overrides: any other `ViTConfig` field, e.g. drop_path_rate=0.1.
    The model's `preprocess` attribute says how to prepare images (see `create_transform`).
    """
    spec = get_spec(name)
    unknown = set(overrides) - set(ViTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(
            f"unknown override(s) {sorted(unknown)} for {name}; "
            f"accepted: {sorted(ViTConfig.__dataclass_fields__)}"
        )
    kwargs = {**spec.arch, "num_classes": spec.num_classes, **overrides}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    preprocess = spec.preprocess
    if img_size is not None:
        kwargs["img_size"] = img_size
        preprocess = replace(preprocess, input_size=to_pair(img_size, "img_size"))
    model = VisionTransformer(**kwargs)
    model.preprocess = preprocess
    model.model_name = name

    if pretrained is True:
        load_weights(model, _timm_pretrained(name, spec.pretrained_tag))
    elif pretrained:
        load_weights(model, pretrained)
    return model


def _timm_pretrained(name: str, tag: str | None):
    """timm's default pretrained model for `name` (timm downloads, caches and converts)."""
    if tag is None:
        raise ValueError(
            f"no published pretrained weights for {name}; pass pretrained=PATH to a weights file "
            f"(e.g. a run folder's model.safetensors)"
        )
    import timm  # imported here: only this path needs it

    return timm.create_model(f"{name}.{tag}", pretrained=True)


def load_model(path: str | Path, num_classes: int | None = None) -> VisionTransformer:
    """Rebuild a model saved by `vit.save_weights` from its `.safetensors` file alone.

    The architecture, class names (`model.class_names`) and preprocessing come from the
    file's metadata."""
    metadata = read_metadata(path)
    if "vit.config" not in metadata:
        raise ValueError(
            f"{path} does not say which architecture it holds (no 'vit.config' metadata); "
            f"load it with vit.create_model(NAME, pretrained={str(path)!r}) instead"
        )
    config = dict(metadata["vit.config"])
    if num_classes is not None:
        config["num_classes"] = num_classes
    model = VisionTransformer(**config)
    load_weights(model, path)
    model.class_names = metadata.get("vit.class_names")
    model.model_name = metadata.get("vit.model_name")
    stored = metadata.get("vit.preprocess")
    model.preprocess = (
        Preprocess.from_dict(stored)
        if stored
        else Preprocess(input_size=model.patch_embed.img_size)
    )
    return model


def create_transform(preprocess: Preprocess) -> T.Compose:
    """The evaluation transform for a PIL image: resize, centre crop, tensor, normalise.

    Matches timm's eval transform: the resize target is input_size / crop_pct (floored), on
    the shorter side for square inputs and on both sides otherwise.
    """
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
