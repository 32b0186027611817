"""Named architectures and the preprocessing their weights expect.

The ImageNet names and numbers are timm's (its default pretrained tag for each name); a test
checks them against timm's own pretrained configs, so they cannot drift apart silently. The
CIFAR names are this project's own: patch 4 on 32x32 images, an 8x8 grid of 64 tokens.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import asdict, dataclass, field, replace

from . import families
from .families import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    IMAGENET_INCEPTION_MEAN,
    IMAGENET_INCEPTION_STD,
)

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


# timm's eval crop modes (`timm.data.transforms_imagenet_eval`), as `vit.data.eval_transform`
# makes them: each resizes towards the scale size, input_size / crop_pct (floored), then crops.
CROP_MODES = ("center", "squash", "border")


@dataclass
class Preprocess:
    """How images must be prepared for a model: resize, crop, normalise, as timm's eval
    transform does (`vit.data.eval_transform`).

    The scale size is `input_size / crop_pct` (floored, each side). `crop_mode` "center" (timm's
    default) resizes keeping the aspect ratio until both sides reach the scale size, then
    centre-crops `input_size`; "squash" resizes both sides to the scale size, then centre-crops;
    "border" resizes keeping the ratio until both sides fit inside it, then pads with the mean
    colour and centre-crops.
    """

    input_size: tuple[int, int] = (224, 224)  # (H, W)
    mean: tuple[float, float, float] = IMAGENET_INCEPTION_MEAN
    std: tuple[float, float, float] = IMAGENET_INCEPTION_STD
    interpolation: str = "bicubic"
    crop_pct: float = 0.9
    crop_mode: str = "center"

    def __post_init__(self) -> None:
        if self.crop_mode not in CROP_MODES:
            raise ValueError(
                f"crop_mode {self.crop_mode!r} is not one of timm's: expected one of "
                f"{', '.join(repr(mode) for mode in CROP_MODES)}"
            )

    def to_dict(self) -> dict:
        """The fields as saved in a file's metadata. crop_mode only where it is not "center",
        so that the metadata (and the feature caches keyed on it) of every model from before
        the field stay as they were; `from_dict` reads its absence as "center"."""
        values = asdict(self)
        if values["crop_mode"] == "center":
            del values["crop_mode"]
        return values

    @classmethod
    def from_dict(cls, values: dict) -> Preprocess:
        values = dict(values)
        for key in ("input_size", "mean", "std"):
            values[key] = tuple(values[key])
        return cls(**values)

    def data_config(self, in_chans: int = 3) -> dict:
        """timm's data config dict: input_size (C, H, W), interpolation, mean, std, crop_pct,
        crop_mode."""
        return dict(
            input_size=(in_chans, *self.input_size),
            interpolation=self.interpolation,
            mean=tuple(self.mean),
            std=tuple(self.std),
            crop_pct=self.crop_pct,
            crop_mode=self.crop_mode,
        )


def model_preprocess(model) -> Preprocess:
    """A model's stored `preprocess`; for a bare `VisionTransformer` (none stored), the default
    preprocessing at its input size, as `vit.load_model` assumes for files that name none."""
    size = model.config.img_size  # an int where square, as timm's img_size
    return model.preprocess or Preprocess(input_size=(size,) * 2 if isinstance(size, int) else size)


def pretrained_cfg_of(model) -> dict:
    """`model.pretrained_cfg`: timm's dict of a model's weights and preprocessing, from our
    `model.preprocess`, `model_name` and config."""
    name = model.model_name
    architecture, tag = split_tag(name) if name and split_tag(name)[0] in MODELS else (name, None)
    config = model.config
    return dict(
        architecture=architecture,
        tag=tag,
        **model_preprocess(model).data_config(config.in_chans),
        fixed_input_size=not config.dynamic_img_size,
        num_classes=model.num_classes,
        first_conv="patch_embed.proj",
        classifier=("head", "head_dist") if config.distilled else "head",
    )


def resolve_model_data_config(model) -> dict:
    """timm's `resolve_model_data_config` for our models: the preprocessing stored with the
    weights (input_size (C, H, W), mean, std, interpolation, crop_pct, crop_mode). timm's own
    falls back to 224 px and ImageNet statistics for a model without its pretrained_cfg."""
    return model_preprocess(model).data_config(model.config.in_chans)


@dataclass
class Weights:
    """One of timm's pretrained tags for a name: its preprocessing and head size."""

    preprocess: Preprocess
    num_classes: int


@dataclass
class ModelSpec:
    """A named model: its architecture arguments, preprocessing, and where its weights live.

    `preprocess` and `num_classes` are those of the default tag; `other_tags` holds timm's other
    tags offered here (e.g. `vit_base_patch16_224.dino`), each with its own.
    """

    arch: dict
    preprocess: Preprocess
    num_classes: int = 1000
    pretrained_tag: str | None = None  # timm's default tag; None: no published weights
    description: str = ""
    # vit, dinov2 (with or without registers), clip, siglip, deit (with or without distillation),
    # deit3, or cifar (coarser than `vit.models.families`' records: see Family.name)
    family: str = "vit"
    other_tags: dict[str, Weights] = field(default_factory=dict)

    @property
    def tags(self) -> list[str]:
        """Every pretrained tag offered for this name, the default first."""
        default = [self.pretrained_tag] if self.pretrained_tag else []
        return default + sorted(self.other_tags)


# name: (embed_dim, depth, num_heads) -- the ViT paper's sizes plus DeiT's tiny, small, medium
# and SigLIP's shape-optimised 400M ("so400m", Alabdulmohsin et al. 2023; mlp_ratio 3.7362)
_SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "medium": (512, 12, 8),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
    "giant": (1536, 40, 24),  # DINOv2's ViT-g/14
    "giantopt": (1536, 40, 16),  # SigLIP 2's shape-optimised giant
    # OpenCLIP's ViT-g/14 (mlp_ratio 48/11), timm's "giant" CLIP; I-JEPA's ViT-g/16 too
    "clip_giant": (1408, 40, 16),
    "gigantic": (1664, 48, 16),  # OpenCLIP's ViT-bigG/14 (mlp_ratio 64/13)
    "so400m": (1152, 27, 16),
    # timm's names between the ViT paper's: TinyCLIP's, OpenCLIP's ViT-B/16+, SoViT-150M
    "xsmall": (256, 10, 4),
    "betwixt": (640, 12, 10),
    "base_plus": (896, 12, 14),
    "so150m": (896, 18, 14),
    # timm's "searching for better ViT baselines" (sbb) shapes
    "wee": (256, 14, 4),
    "little": (320, 14, 5),
    "mediumd": (512, 20, 8),
    "so150m2": (832, 21, 13),
}


def _preprocess(
    image: int,
    crop_pct: float,
    mean=IMAGENET_DEFAULT_MEAN,
    std=IMAGENET_DEFAULT_STD,
    crop_mode: str = "center",
):
    return Preprocess(
        input_size=(image, image), mean=mean, std=std, crop_pct=crop_pct, crop_mode=crop_mode
    )


def _spec(size: str, patch: int, image: int, tag: str | None, **spec) -> ModelSpec:
    dim, depth, heads = _SIZES[size]
    arch = dict(img_size=image, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads)
    arch.update(spec.pop("arch", {}))
    return ModelSpec(arch=arch, pretrained_tag=tag, **spec)


# timm's other tags of the plain ViTs (Google's weights: mean = std = 0.5) and their head sizes
_GOOGLE_TAG_CLASSES = {
    "augreg_in21k": 21843,  # ImageNet-21k classifier (Steiner et al. 2021, "How to train your ViT")
    "augreg_in1k": 1000,
    "augreg_in21k_ft_in1k": 1000,
    "orig_in21k": 0,  # the original paper's ImageNet-21k backbone, head removed
    "orig_in21k_ft_in1k": 1000,
    "sam_in1k": 1000,  # trained with sharpness-aware minimisation (Chen et al. 2022)
}


def _imagenet(size: str, patch: int, image: int, tag: str | None, *tags: str, **spec) -> ModelSpec:
    """A plain ViT: `tag` is timm's default, `tags` its other Google tags offered here."""
    preprocess = spec.pop("preprocess", None) or Preprocess(
        input_size=(image, image), crop_pct=0.9 if image == 224 else 1.0
    )
    google = Preprocess(input_size=(image, image), crop_pct=0.9 if image == 224 else 1.0)
    other = {t: Weights(google, _GOOGLE_TAG_CLASSES[t]) for t in tags}
    other.update(spec.pop("other_tags", {}))
    return _spec(size, patch, image, tag, preprocess=preprocess, other_tags=other, **spec)


_AUGREG = "augreg_in21k_ft_in1k"
_DINO = Preprocess(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
# Self-supervised tags of the plain architectures: headless backbones, ImageNet mean/std
_DINO_TAG = {"dino": Weights(_DINO, 0)}  # DINO v1 (Caron et al. 2021)
_MAE_TAG = {"mae": Weights(_DINO, 0)}  # masked autoencoders (He et al. 2022)
_IN21K, _IN1K, _SAM = "augreg_in21k", "augreg_in1k", "sam_in1k"
_ORIG, _ORIG_FT = "orig_in21k", "orig_in21k_ft_in1k"

MODELS: dict[str, ModelSpec] = {
    "vit_tiny_patch16_224": _imagenet("tiny", 16, 224, _AUGREG, _IN21K),
    "vit_tiny_patch16_384": _imagenet("tiny", 16, 384, _AUGREG),
    "vit_small_patch32_224": _imagenet("small", 32, 224, _AUGREG, _IN21K),
    "vit_small_patch32_384": _imagenet("small", 32, 384, _AUGREG),
    "vit_small_patch16_224": _imagenet(
        "small", 16, 224, _AUGREG, _IN21K, _IN1K, other_tags=_DINO_TAG
    ),
    "vit_small_patch16_384": _imagenet("small", 16, 384, _AUGREG, _IN1K),
    # DINO self-supervised weights: no classifier head, ImageNet mean/std
    "vit_small_patch8_224": _imagenet("small", 8, 224, "dino", num_classes=0, preprocess=_DINO),
    "vit_base_patch32_224": _imagenet("base", 32, 224, _AUGREG, _IN21K, _IN1K, _ORIG, _SAM),
    "vit_base_patch32_384": _imagenet("base", 32, 384, _AUGREG, _IN1K),
    "vit_base_patch16_224": _imagenet(
        "base",
        16,
        224,
        "augreg2_in21k_ft_in1k",
        _AUGREG,
        _IN21K,
        _IN1K,
        _ORIG,
        _ORIG_FT,
        _SAM,
        other_tags={**_DINO_TAG, **_MAE_TAG},
    ),  # fmt: skip
    "vit_base_patch16_384": _imagenet("base", 16, 384, _AUGREG, _IN1K, _ORIG_FT),
    "vit_base_patch8_224": _imagenet(
        "base", 8, 224, "augreg2_in21k_ft_in1k", _AUGREG, _IN21K, other_tags=_DINO_TAG
    ),
    # ImageNet-21k pre-trained only: a feature extractor, no classifier head
    "vit_large_patch32_224": _imagenet("large", 32, 224, "orig_in21k", num_classes=0),
    "vit_large_patch32_384": _imagenet("large", 32, 384, "orig_in21k_ft_in1k"),
    "vit_large_patch16_224": _imagenet(
        "large", 16, 224, _AUGREG, _IN21K, _ORIG, other_tags=_MAE_TAG
    ),
    "vit_large_patch16_384": _imagenet("large", 16, 384, _AUGREG),
    "vit_large_patch14_224": _imagenet("large", 14, 224, None),  # timm has no weights for it
    "vit_huge_patch14_224": _imagenet(
        "huge", 14, 224, "orig_in21k", num_classes=0, other_tags=_MAE_TAG
    ),
}


def _family(family: str, size: str, patch: int, image: int, arch: dict, **tags: Weights):
    """A family member; `tags` are timm's pretrained tags, the default (timm's first) first."""
    default, *_ = tags
    weights = tags.pop(default)
    return _spec(
        size,
        patch,
        image,
        default,
        arch=arch,
        preprocess=weights.preprocess,
        num_classes=weights.num_classes,
        family=family,
        other_tags=tags,
    )


def _in(crop_pct: float, num_classes: int = 1000, image: int = 224) -> Weights:
    """Weights expecting ImageNet mean/std."""
    return Weights(_preprocess(image, crop_pct), num_classes)


def _openai(
    crop_pct: float, num_classes: int, image: int = 224, crop_mode: str = "center"
) -> Weights:
    """Weights expecting OpenAI CLIP's mean/std (the CLIP family's usual); `crop_mode` "squash":
    resized to the input size whole, not cropped (timm's ImageNet fine-tunes above 224 px)."""
    clip = families.CLIP
    return Weights(_preprocess(image, crop_pct, clip.mean, clip.std, crop_mode), num_classes)


def _half(
    crop_pct: float, num_classes: int, image: int = 224, crop_mode: str = "center"
) -> Weights:
    """Weights expecting mean = std = 0.5 (inputs in [-1, 1]: SigLIP's usual, some LAION CLIPs)."""
    siglip = families.SIGLIP
    return Weights(_preprocess(image, crop_pct, siglip.mean, siglip.std, crop_mode), num_classes)


# The families' switches are their records' (`vit.models.families`).
# DINOv2 (Oquab et al. 2023): LayerScale, patch 14 at 518 px, headless. With registers (Darcet
# et al. 2024): 4 register tokens, position embeddings on the patches only.
_DINOV2 = dict(families.DINOV2.switches)
_DINOV2_REG = dict(families.DINOV2_REG.switches)
# ViT-g/14: a gated MLP of 4096 channels (DINOv2's two thirds of 4 x 1536, rounded up to a
# multiple of 8), packed with its gate into fc1's 8192 rows; timm's mlp_ratio, 2.66667 * 2
_SWIGLU = dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=2.66667 * 2)
_LVD = _in(1.0, 0, image=518)
# CLIP image towers (Radford et al. 2021): a LayerNorm before the blocks, eps 1e-5. The
# zero-shot tags' head is CLIP's image projection into the text space (its width, no classes);
# the _ft_ tags classify ImageNet. The _quickgelu_ names keep OpenAI's original activation.
_CLIP = dict(families.CLIP.switches)
_CLIP_QUICKGELU = dict(_CLIP, act_layer="quick_gelu")
# CLIP towers above 224 px, ViT-g/14 and ViT-bigG/14 (OpenCLIP), DFN5B and MetaCLIP 2's
# ViT-H/14: timm's names and tags; its ImageNet fine-tunes above 224 px are squashed, not cropped
_SQUASH = dict(crop_mode="squash")
_CLIP_GIANT = dict(_CLIP, mlp_ratio=48 / 11)
_GIGANTIC = dict(_CLIP, mlp_ratio=64 / 13)
_LARGER_CLIPS = {
    "vit_base_patch16_clip_384": _family(
        "clip",
        "base",
        16,
        384,
        _CLIP,
        laion2b_ft_in12k_in1k=_openai(1.0, 1000, image=384, **_SQUASH),
        laion2b_ft_in1k=_openai(1.0, 1000, image=384, **_SQUASH),
        openai_ft_in1k=_openai(1.0, 1000, image=384, **_SQUASH),
        openai_ft_in12k_in1k=_openai(0.95, 1000, image=384, **_SQUASH),
    ),
    "vit_base_patch32_clip_256": _family(
        "clip", "base", 32, 256, _CLIP, datacompxl=_openai(1.0, 512, image=256)
    ),
    "vit_base_patch32_clip_384": _family(
        "clip",
        "base",
        32,
        384,
        _CLIP,
        laion2b_ft_in12k_in1k=_openai(1.0, 1000, image=384),
        openai_ft_in12k_in1k=_openai(0.95, 1000, image=384, **_SQUASH),
    ),
    "vit_base_patch32_clip_448": _family(
        "clip", "base", 32, 448, _CLIP, laion2b_ft_in12k_in1k=_openai(1.0, 1000, image=448)
    ),
    "vit_large_patch14_clip_336": _family(
        "clip",
        "large",
        14,
        336,
        _CLIP,
        laion2b_ft_in12k_in1k=_half(1.0, 1000, image=336, **_SQUASH),
        laion2b_ft_in1k=_half(1.0, 1000, image=336, **_SQUASH),
        openai=_openai(1.0, 768, image=336),
        openai_ft_in12k_in1k=_openai(1.0, 1000, image=336, **_SQUASH),
    ),
    "vit_huge_patch14_clip_336": _family(
        "clip",
        "huge",
        14,
        336,
        _CLIP,
        laion2b_ft_in12k_in1k=_openai(1.0, 1000, image=336, **_SQUASH),
    ),
    "vit_huge_patch14_clip_378": _family(
        "clip",
        "huge",
        14,
        378,
        _CLIP,
        dfn5b=_openai(1.0, 1024, image=378),
        metaclip2_worldwide=_openai(1.0, 1024, image=378, **_SQUASH),
    ),
    "vit_huge_patch14_clip_quickgelu_224": _family(
        "clip",
        "huge",
        14,
        224,
        _CLIP_QUICKGELU,
        dfn5b=_openai(1.0, 1024),
        metaclip2_worldwide=_openai(1.0, 1024),
        metaclip_2pt5b=_openai(1.0, 1024),
    ),
    "vit_huge_patch14_clip_quickgelu_378": _family(
        "clip", "huge", 14, 378, _CLIP_QUICKGELU, dfn5b=_openai(1.0, 1024, image=378)
    ),
    "vit_giant_patch14_clip_224": _family(
        "clip", "clip_giant", 14, 224, _CLIP_GIANT, laion2b=_openai(1.0, 1024)
    ),
    "vit_gigantic_patch14_clip_224": _family(
        "clip",
        "gigantic",
        14,
        224,
        _GIGANTIC,
        laion2b=_openai(1.0, 1280),
        metaclip2_worldwide=_openai(1.0, 1280),
        metaclip_2pt5b=_openai(1.0, 1280),
    ),
    "vit_gigantic_patch14_clip_378": _family(
        "clip",
        "gigantic",
        14,
        378,
        _GIGANTIC,
        metaclip2_worldwide=_openai(1.0, 1280, image=378, **_SQUASH),
    ),
    "vit_gigantic_patch14_clip_quickgelu_224": _family(
        "clip",
        "gigantic",
        14,
        224,
        dict(_GIGANTIC, act_layer="quick_gelu"),
        metaclip_2pt5b=_openai(1.0, 1280),
    ),
}
# SigLIP (Zhai et al. 2023): no class token, an attention-pool readout, headless.
_SIGLIP = dict(families.SIGLIP.switches)
_SO400M_MLP_RATIO = 3.7362  # the shape-optimised 400M's MLP: 4304 wide at 1152
# No class token, the final norm, then the patch tokens' mean (no fc_norm): SigLIP's gap
# towers, I-JEPA's encoders
_GAP = dict(class_token=False, global_pool="avg", fc_norm=False)
# PaliGemma's towers (Beyer et al. 2024; 2: Steiner et al. 2024), the default (timm's) first
_PALI_224 = ("pali2_3b_pt", "pali2_10b_pt", "pali_mix", "pali_pt")
_PALI_448 = ("pali_mix", "pali2_3b_docci", "pali2_3b_pt", "pali2_10b_docci", "pali2_10b_pt")
_PALI_448 += ("pali_ocrvqa", "pali_pt", "pali_refcoco_seg")
_PALI_896 = ("pali_pt", "pali2_3b_pt", "pali2_10b_pt", "pali_ocrvqa", "pali_refcoco_seg")


def _headless(image: int, crop_pct: float, *tags: str) -> dict[str, Weights]:
    """SigLIP's headless tags at `image` px (mean = std = 0.5), in timm's order."""
    return {tag: _half(crop_pct, 0, image=image) for tag in tags}


def _siglip(
    size: str, patch: int, image: int, act: str, tags: dict[str, Weights], gap: bool = False
) -> ModelSpec:
    """A SigLIP tower by timm's `_siglip_` name (the attention pool) or its `_siglip_gap_` one
    (gap=True); `act`: the tanh GELU where timm gives it (SigLIP 2's new shapes)."""
    arch = dict(_GAP if gap else _SIGLIP, act_layer=act)
    if size == "so400m":
        arch["mlp_ratio"] = _SO400M_MLP_RATIO
    return _family("siglip", size, patch, image, arch, **tags)


# so400m's ImageNet fine-tune
_IN1K_378 = {"webli_ft_in1k": _half(1.0, 1000, image=378, crop_mode="squash")}
_WEBLI = ("v2_webli", "webli")
# The SigLIP shapes timm names with the same tags under both readouts (the attention pool, gap)
_SIGLIP_SHAPES = (
    ("base", 16, 224, "gelu", _headless(224, 0.9, *_WEBLI)),
    ("base", 16, 256, "gelu", _headless(256, 0.9, *_WEBLI, "webli_i18n")),
    ("base", 16, 384, "gelu", _headless(384, 0.9, *_WEBLI)),
    ("base", 16, 512, "gelu", _headless(512, 0.9, *_WEBLI)),
    ("base", 32, 256, "gelu_tanh", _headless(256, 0.9, "v2_webli")),
    ("large", 16, 256, "gelu", _headless(256, 0.9, *_WEBLI)),
    ("large", 16, 384, "gelu", _headless(384, 0.9, *_WEBLI)),
    ("large", 16, 512, "gelu_tanh", _headless(512, 0.9, "v2_webli")),
    ("giantopt", 16, 256, "gelu_tanh", _headless(256, 0.9, "v2_webli")),
    ("giantopt", 16, 384, "gelu_tanh", _headless(384, 0.9, "v2_webli")),
    ("so400m", 16, 256, "gelu_tanh", _headless(256, 0.9, "v2_webli", "webli_i18n")),
    ("so400m", 16, 384, "gelu_tanh", _headless(384, 0.9, "v2_webli")),
    ("so400m", 16, 512, "gelu_tanh", _headless(512, 0.9, "v2_webli")),
)


# CLIP's smaller relatives: TinyCLIP (Wu et al. 2023), distilled from OpenCLIP's ViT-B, and
# OpenCLIP's ViT-B/16+ at 240 px; their heads project into the text space (512, 640 wide)
_SMALLER_CLIPS = {
    "vit_xsmall_patch16_clip_224": _family(
        "clip", "xsmall", 16, 224, _CLIP, tinyclip_yfcc15m=_openai(0.9, 512)
    ),
    "vit_medium_patch32_clip_224": _family(
        "clip", "medium", 32, 224, _CLIP, tinyclip_laion400m=_openai(0.9, 512)
    ),
    "vit_medium_patch16_clip_224": _family(
        "clip", "medium", 16, 224, _CLIP, tinyclip_yfcc15m=_openai(0.9, 512)
    ),
    "vit_betwixt_patch32_clip_224": _family(
        "clip", "betwixt", 32, 224, _CLIP, tinyclip_laion400m=_openai(0.9, 512)
    ),
    "vit_base_patch16_plus_clip_240": _family(
        "clip", "base_plus", 16, 240, _CLIP, laion400m_e32=_openai(1.0, 640, image=240)
    ),
}


def _miil(num_classes: int) -> Weights:
    """MIIL's ImageNet-21k-P weights (Ridnik et al. 2021): inputs in [0, 1], bilinear, 0.875."""
    unit = Preprocess(mean=(0.0,) * 3, std=(1.0,) * 3, interpolation="bilinear", crop_pct=0.875)
    return Weights(unit, num_classes)


# timm's own ViTs from "searching for better ViT baselines" (sbb): LayerScale, the patch
# tokens' mean, most with 1 or 4 registers and position embeddings on the patches only
_SBB_1 = dict(_GAP, init_values=1e-5, no_embed_class=True, fc_norm=None, reg_tokens=1)
_SBB_4, _LITTLE_1 = dict(_SBB_1, reg_tokens=4), dict(_SBB_1, mlp_ratio=5.6)
_SO150M2 = dict(_SBB_1, no_embed_class=False, mlp_ratio=34 / 13, qkv_bias=False)
# SoViT-150M (the shape of Alabdulmohsin et al. 2023, trained by timm): 4 registers, no LayerScale
_SO150M = dict(_GAP, reg_tokens=4, mlp_ratio=2.572)


def _sbb(image: int, crop_pct: float, *tags: str, crop_mode: str = "center"):
    """sbb tags at `image` px (mean = std = 0.5), in timm's order; a tag ending in "in12k"
    classifies ImageNet-12k (timm's 11,821 ImageNet-22k classes with enough images), the rest
    ImageNet-1k."""
    return {
        tag: _half(crop_pct, 11821 if tag.endswith("in12k") else 1000, image, crop_mode)
        for tag in tags
    }


_MEDIUM_GAP = dict(_GAP, init_values=1e-6, qkv_bias=False)
_SBB2 = "sbb2_e200_in12k_ft_in1k"  # timm's second sbb round, 200 epochs on ImageNet-12k
_SBB_MODELS = {
    f"vit_{size}_patch16_{kind}_{image}": _family("vit", size, 16, image, arch, **tags)
    for size, kind, image, arch, tags in (
        ("medium", "gap", 240, _MEDIUM_GAP, _sbb(240, 0.95, "sw_in12k")),
        ("medium", "gap", 256, _MEDIUM_GAP, _sbb(256, 0.95, "sw_in12k_ft_in1k")),
        ("medium", "gap", 384, _MEDIUM_GAP, _sbb(384, 0.95, "sw_in12k_ft_in1k", **_SQUASH)),
        ("medium", "reg1_gap", 256, _SBB_1, _sbb(256, 0.95, "sbb_in1k")),
        (
            "medium",
            "reg4_gap",
            256,
            _SBB_4,
            _sbb(256, 0.95, "sbb_in12k_ft_in1k", "sbb_in1k", "sbb_in12k"),
        ),
        ("betwixt", "reg1_gap", 256, _SBB_1, _sbb(256, 0.95, "sbb_in1k")),
        (
            "betwixt",
            "reg4_gap",
            256,
            _SBB_4,
            _sbb(256, 0.95, _SBB2, "sbb_in12k_ft_in1k", "sbb_in1k", "sbb2_e200_in12k", "sbb_in12k"),
        ),
        ("betwixt", "reg4_gap", 384, _SBB_4, _sbb(384, 1.0, _SBB2)),
        ("little", "reg1_gap", 256, _LITTLE_1, _sbb(256, 0.95, "sbb_in12k_ft_in1k", "sbb_in12k")),
        ("little", "reg4_gap", 256, dict(_LITTLE_1, reg_tokens=4), _sbb(256, 0.95, "sbb_in1k")),
        ("wee", "reg1_gap", 256, dict(_SBB_1, mlp_ratio=5), _sbb(256, 0.95, "sbb_in1k")),
        (
            "mediumd",
            "reg4_gap",
            256,
            _SBB_4,
            _sbb(256, 0.95, _SBB2, "sbb_in12k_ft_in1k", "sbb2_e200_in12k", "sbb_in12k"),
        ),
        ("mediumd", "reg4_gap", 384, _SBB_4, _sbb(384, 1.0, _SBB2)),
        (
            "so150m2",
            "reg1_gap",
            256,
            _SO150M2,
            _sbb(256, 1.0, "sbb_e200_in12k_ft_in1k", "sbb_e200_in12k"),
        ),
        ("so150m2", "reg1_gap", 384, _SO150M2, _sbb(384, 1.0, "sbb_e200_in12k_ft_in1k")),
        ("so150m2", "reg1_gap", 448, _SO150M2, _sbb(448, 1.0, "sbb_e200_in12k_ft_in1k", **_SQUASH)),
        (
            "so150m",
            "reg4_gap",
            256,
            _SO150M,
            _sbb(256, 0.95, "sbb_e250_in12k_ft_in1k", "sbb_e250_in12k"),
        ),
        ("so150m", "reg4_gap", 384, _SO150M, _sbb(384, 1.0, "sbb_e250_in12k_ft_in1k")),
    )
}
# timm's other plain ViTs with published weights: MIIL's ViT-B/16 (no qkv bias), I-JEPA's
# headless encoders (Assran et al. 2023; the patch tokens' mean)
_OTHER_PLAIN = {
    "vit_base_patch16_224_miil": _family(
        "vit", "base", 16, 224, dict(qkv_bias=False), in21k=_miil(11221), in21k_ft_in1k=_miil(1000)
    ),
    "vit_huge_patch14_gap_224": _family(
        "vit", "huge", 14, 224, _GAP, in1k_ijepa=_in(0.9, 0), in22k_ijepa=_in(0.9, 0)
    ),
    "vit_huge_patch16_gap_448": _family(
        "vit", "huge", 16, 448, _GAP, in1k_ijepa=_in(1.0, 0, image=448)
    ),
    "vit_giant_patch16_gap_224": _family(
        "vit", "clip_giant", 16, 224, dict(_GAP, mlp_ratio=48 / 11), in22k_ijepa=_in(0.9, 0)
    ),
}


# DeiT III (Touvron et al. 2022): LayerScale, position embeddings on the patches only.
_DEIT3 = dict(families.DEIT3.switches)

MODELS.update(
    {
        "vit_small_patch14_dinov2": _family("dinov2", "small", 14, 518, _DINOV2, lvd142m=_LVD),
        "vit_base_patch14_dinov2": _family("dinov2", "base", 14, 518, _DINOV2, lvd142m=_LVD),
        "vit_large_patch14_dinov2": _family("dinov2", "large", 14, 518, _DINOV2, lvd142m=_LVD),
        "vit_giant_patch14_dinov2": _family(
            "dinov2", "giant", 14, 518, dict(_DINOV2, **_SWIGLU), lvd142m=_LVD
        ),
        "vit_small_patch14_reg4_dinov2": _family(
            "dinov2", "small", 14, 518, _DINOV2_REG, lvd142m=_LVD
        ),
        "vit_base_patch14_reg4_dinov2": _family(
            "dinov2", "base", 14, 518, _DINOV2_REG, lvd142m=_LVD
        ),
        "vit_large_patch14_reg4_dinov2": _family(
            "dinov2", "large", 14, 518, _DINOV2_REG, lvd142m=_LVD
        ),
        "vit_giant_patch14_reg4_dinov2": _family(
            "dinov2", "giant", 14, 518, dict(_DINOV2_REG, **_SWIGLU), lvd142m=_LVD
        ),
        "vit_base_patch32_clip_224": _family(
            "clip",
            "base",
            32,
            224,
            _CLIP,
            laion2b_ft_in12k_in1k=_openai(0.9, 1000),
            openai=_openai(0.9, 512),
            laion2b=_openai(0.9, 512),
        ),
        "vit_base_patch16_clip_224": _family(
            "clip",
            "base",
            16,
            224,
            _CLIP,
            laion2b_ft_in12k_in1k=_openai(0.95, 1000),
            openai=_openai(0.9, 512),
            laion2b=_openai(1.0, 512),
        ),
        "vit_large_patch14_clip_224": _family(
            "clip",
            "large",
            14,
            224,
            _CLIP,
            laion2b_ft_in12k_in1k=_half(1.0, 1000),
            openai=_openai(1.0, 768),
            laion2b=_half(1.0, 768),
        ),
        "vit_huge_patch14_clip_224": _family(
            "clip",
            "huge",
            14,
            224,
            _CLIP,
            laion2b_ft_in12k_in1k=_openai(1.0, 1000),
            laion2b=_openai(1.0, 1024),
        ),
        "vit_base_patch32_clip_quickgelu_224": _family(
            "clip",
            "base",
            32,
            224,
            _CLIP_QUICKGELU,
            laion400m_e32=_openai(0.9, 512),
            openai=_openai(0.9, 512),
        ),
        "vit_base_patch16_clip_quickgelu_224": _family(
            "clip",
            "base",
            16,
            224,
            _CLIP_QUICKGELU,
            metaclip_2pt5b=_openai(1.0, 512),
            openai=_openai(0.9, 512),
        ),
        "vit_large_patch14_clip_quickgelu_224": _family(
            "clip",
            "large",
            14,
            224,
            _CLIP_QUICKGELU,
            dfn2b=_openai(1.0, 768),
            openai=_openai(1.0, 768),
        ),
        "vit_large_patch14_clip_quickgelu_336": _family(
            "clip", "large", 14, 336, _CLIP_QUICKGELU, openai=_openai(1.0, 768, image=336)
        ),
        **_LARGER_CLIPS,
        **_SMALLER_CLIPS,
        **_OTHER_PLAIN,
        **_SBB_MODELS,
        **{
            f"vit_{size}_patch{patch}_siglip_{image}": _siglip(size, patch, image, act, tags)
            for size, patch, image, act, tags in (
                *_SIGLIP_SHAPES,
                ("so400m", 14, 224, "gelu", _headless(224, 0.9, *_WEBLI)),
                ("so400m", 14, 378, "gelu", {**_headless(378, 0.9, *_WEBLI), **_IN1K_378}),
                # 384 px in 14-px patches: a 27 x 27 grid over 378 px, a 6-px margin unseen
                ("so400m", 14, 384, "gelu", _headless(384, 0.9, "webli")),
            )
        },
        # SigLIP's "gap" towers (timm's _gap_ names): the patch tokens' mean after the final
        # norm in place of the attention pool, PaliGemma's image encoder (the pali tags)
        **{
            f"vit_{size}_patch{patch}_siglip_gap_{image}": _siglip(
                size, patch, image, act, tags, gap=True
            )
            for size, patch, image, act, tags in (
                *_SIGLIP_SHAPES,
                ("so400m", 14, 224, "gelu", _headless(224, 0.9, *_WEBLI, *_PALI_224)),
                (
                    "so400m",
                    14,
                    378,
                    "gelu",
                    {
                        **_headless(378, 0.9, "v2_webli"),
                        **_headless(378, 1.0, "webli"),
                        **_IN1K_378,
                    },
                ),
                ("so400m", 14, 384, "gelu", _headless(384, 1.0, "webli")),
                ("so400m", 14, 448, "gelu", _headless(448, 1.0, *_PALI_448)),
                ("so400m", 14, 896, "gelu", _headless(896, 1.0, *_PALI_896)),
            )
        },
        # DeiT (Touvron et al. 2021): the plain ViT trained on ImageNet-1k alone; the distilled
        # ones add a distillation token whose head learned from a convnet teacher.
        **{
            f"deit_{size}_{kind}patch16_{image}": _family(
                "deit",
                size,
                16,
                image,
                dict(families.DEIT.switches) if kind else {},
                fb_in1k=_in(0.9 if image == 224 else 1.0, image=image),
            )
            for kind in ("", "distilled_")
            for size, image in (("tiny", 224), ("small", 224), ("base", 224), ("base", 384))
        },
        **{
            f"deit3_{size}_patch{patch}_{image}": _family(
                "deit3",
                size,
                patch,
                image,
                _DEIT3,
                fb_in1k=_in(0.9 if image == 224 else 1.0, image=image),
                fb_in22k_ft_in1k=_in(1.0, image=image),
            )
            for size, patch, image in (
                ("small", 16, 224),
                ("medium", 16, 224),
                ("base", 16, 224),
                ("large", 16, 224),
                ("huge", 14, 224),
                ("small", 16, 384),
                ("base", 16, 384),
                ("large", 16, 384),
            )
        },
    }
)

_CIFAR = Preprocess(input_size=(32, 32), mean=CIFAR10_MEAN, std=CIFAR10_STD, crop_pct=1.0)


def _cifar(dim: int, depth: int, heads: int, mlp_ratio: float, description: str) -> ModelSpec:
    arch = dict(
        img_size=32, patch_size=4, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=mlp_ratio
    )
    return ModelSpec(
        arch=arch, preprocess=_CIFAR, num_classes=10, description=description, family="cifar"
    )


MODELS.update(
    {
        # The project's CIFAR recipe model: the plain-ViT baseline of Lee et al. 2021
        # ("Vision Transformer for Small-Size Datasets"), 2.7M parameters.
        "vit_cifar_patch4_32": _cifar(192, 9, 12, 2.0, "CIFAR recipe: 192-d, 9 blocks"),
        "vit_tiny_patch4_32": _cifar(192, 12, 3, 4.0, "ViT-Ti geometry on 32x32 images"),
        "vit_small_patch4_32": _cifar(384, 12, 6, 4.0, "ViT-S geometry on 32x32 images"),
    }
)


def list_models(filter: str | list[str] = "", pretrained: bool = False) -> list[str]:
    """Model names `vit.create_model` accepts, sorted, as timm's `list_models`.

    filter: an fnmatch pattern (or several), e.g. "vit_small*" or "*dinov2*".
    pretrained: list only names with published weights, as "name.tag" for every tag offered.
    """
    if pretrained:
        names = [f"{name}.{tag}" for name, spec in MODELS.items() for tag in spec.tags]
    else:
        names = list(MODELS)
    patterns = [filter] if isinstance(filter, str) else list(filter)
    if any(patterns):
        names = {n for p in patterns if p for n in fnmatch.filter(names, p)}
    return sorted(names)


def split_tag(name: str) -> tuple[str, str | None]:
    """ "vit_base_patch16_224.dino" -> ("vit_base_patch16_224", "dino"); no tag -> None."""
    base, _, tag = name.partition(".")
    return base, tag or None


def close_model_names(name: str) -> list[str]:
    """Up to three known model names close to a misspelt one (tag left out), best first."""
    return difflib.get_close_matches(split_tag(name)[0].lower(), MODELS, n=3, cutoff=0.6)


def get_spec(name: str) -> ModelSpec:
    """The spec for a model name, with an optional ".tag" (timm's pretrained tags) selecting
    that tag's preprocessing and head size; a ValueError names close matches or the tags."""
    base, tag = split_tag(name)
    if base not in MODELS:
        close = close_model_names(base)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"unknown model name {base!r}.{hint} Known names: {', '.join(list_models())}"
        )
    spec = MODELS[base]
    if tag is None or tag == spec.pretrained_tag:
        return spec
    if tag not in spec.other_tags:
        offered = ", ".join(spec.tags) or "none (no published weights)"
        raise ValueError(f"unknown pretrained tag {tag!r} for {base}; offered tags: {offered}")
    weights = spec.other_tags[tag]
    return replace(
        spec, preprocess=weights.preprocess, num_classes=weights.num_classes, pretrained_tag=tag
    )
