"""Named architectures and the preprocessing their weights expect.

The ImageNet names and numbers are timm's (its default pretrained tag for each name); a test
checks them against timm's own pretrained configs, so they cannot drift apart silently. The
CIFAR names are this project's own: patch 4 on 32x32 images, an 8x8 grid of 64 tokens.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

IMAGENET_INCEPTION_MEAN = (0.5, 0.5, 0.5)
IMAGENET_INCEPTION_STD = (0.5, 0.5, 0.5)
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


@dataclass
class Preprocess:
    """How images must be prepared for a model: resize, centre crop, normalise.

    Evaluation resizes the shorter side to `input_size / crop_pct` and centre-crops
    `input_size`, as timm's eval transform does.
    """

    input_size: tuple[int, int] = (224, 224)  # (H, W)
    mean: tuple[float, float, float] = IMAGENET_INCEPTION_MEAN
    std: tuple[float, float, float] = IMAGENET_INCEPTION_STD
    interpolation: str = "bicubic"
    crop_pct: float = 0.9

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> Preprocess:
        values = dict(values)
        for key in ("input_size", "mean", "std"):
            values[key] = tuple(values[key])
        return cls(**values)


@dataclass
class ModelSpec:
    """A named model: its architecture arguments, preprocessing, and where its weights live."""

    arch: dict
    preprocess: Preprocess
    num_classes: int = 1000
    pretrained_tag: str | None = None  # timm's default tag; None: no published weights
    description: str = ""


# name: (embed_dim, depth, num_heads) -- the ViT paper's sizes plus DeiT's tiny and small
_SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}


def _imagenet(size: str, patch: int, image: int, tag: str | None, **spec) -> ModelSpec:
    dim, depth, heads = _SIZES[size]
    preprocess = spec.pop("preprocess", None) or Preprocess(
        input_size=(image, image), crop_pct=0.9 if image == 224 else 1.0
    )
    arch = dict(img_size=image, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads)
    return ModelSpec(arch=arch, preprocess=preprocess, pretrained_tag=tag, **spec)


_AUGREG = "augreg_in21k_ft_in1k"
_DINO = Preprocess(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)

MODELS: dict[str, ModelSpec] = {
    "vit_tiny_patch16_224": _imagenet("tiny", 16, 224, _AUGREG),
    "vit_tiny_patch16_384": _imagenet("tiny", 16, 384, _AUGREG),
    "vit_small_patch32_224": _imagenet("small", 32, 224, _AUGREG),
    "vit_small_patch32_384": _imagenet("small", 32, 384, _AUGREG),
    "vit_small_patch16_224": _imagenet("small", 16, 224, _AUGREG),
    "vit_small_patch16_384": _imagenet("small", 16, 384, _AUGREG),
    # DINO self-supervised weights: no classifier head, ImageNet mean/std
    "vit_small_patch8_224": _imagenet("small", 8, 224, "dino", num_classes=0, preprocess=_DINO),
    "vit_base_patch32_224": _imagenet("base", 32, 224, _AUGREG),
    "vit_base_patch32_384": _imagenet("base", 32, 384, _AUGREG),
    "vit_base_patch16_224": _imagenet("base", 16, 224, "augreg2_in21k_ft_in1k"),
    "vit_base_patch16_384": _imagenet("base", 16, 384, _AUGREG),
    "vit_base_patch8_224": _imagenet("base", 8, 224, "augreg2_in21k_ft_in1k"),
    # ImageNet-21k pre-trained only: a feature extractor, no classifier head
    "vit_large_patch32_224": _imagenet("large", 32, 224, "orig_in21k", num_classes=0),
    "vit_large_patch32_384": _imagenet("large", 32, 384, "orig_in21k_ft_in1k"),
    "vit_large_patch16_224": _imagenet("large", 16, 224, _AUGREG),
    "vit_large_patch16_384": _imagenet("large", 16, 384, _AUGREG),
    "vit_large_patch14_224": _imagenet("large", 14, 224, None),  # timm has no weights for it
    "vit_huge_patch14_224": _imagenet("huge", 14, 224, "orig_in21k", num_classes=0),
}

_CIFAR = Preprocess(input_size=(32, 32), mean=CIFAR10_MEAN, std=CIFAR10_STD, crop_pct=1.0)


def _cifar(dim: int, depth: int, heads: int, mlp_ratio: float, description: str) -> ModelSpec:
    arch = dict(
        img_size=32, patch_size=4, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=mlp_ratio
    )
    return ModelSpec(arch=arch, preprocess=_CIFAR, num_classes=10, description=description)


MODELS.update(
    {
        # The project's CIFAR recipe model: the plain-ViT baseline of Lee et al. 2021
        # ("Vision Transformer for Small-Size Datasets"), 2.7M parameters.
        "vit_cifar_patch4_32": _cifar(192, 9, 12, 2.0, "CIFAR recipe: 192-d, 9 blocks"),
        "vit_tiny_patch4_32": _cifar(192, 12, 3, 4.0, "ViT-Ti geometry on 32x32 images"),
        "vit_small_patch4_32": _cifar(384, 12, 6, 4.0, "ViT-S geometry on 32x32 images"),
    }
)


def list_models() -> list[str]:
    """Every model name `vit.create_model` accepts, sorted."""
    return sorted(MODELS)


def get_spec(name: str) -> ModelSpec:
    """The spec for a model name, or a ValueError naming close matches."""
    if name not in MODELS:
        close = difflib.get_close_matches(name, MODELS, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown model name {name!r}.{hint} Known names: {', '.join(list_models())}"
        )
    return MODELS[name]
