"""One record per model family: everything the package knows about it, in one place.

timm expresses every family with one `VisionTransformer` and a few switches (`ViTConfig`
fields); a record says which switches make the family, the tensors they create, which
checkpoint layouts (`vit.interop.layouts`) read it, the transformers classes it is read from and
written as, its usual preprocessing, and which tokens its head reads (for explanations).
The model, the loaders, `configs`' presets and export read these records; adding a family
means adding its record here and its layout file in `vit/interop/layouts/`.

Imports nothing heavy (no torch): `vit.models.registry` builds its presets from the records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Normalisation constants (mean, std) the families' weights expect
IMAGENET_INCEPTION_MEAN = (0.5, 0.5, 0.5)  # inputs in [-1, 1]: Google's ViTs, SigLIP
IMAGENET_INCEPTION_STD = (0.5, 0.5, 0.5)
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# A ViTConfig switch -> the state-dict tensors it creates (key fragments), so that weights that
# do not fit a model can name the switch they were made with.
SWITCH_TENSORS: dict[str, tuple[str, ...]] = {
    "init_values": (".ls1.gamma", ".ls2.gamma"),  # LayerScale
    "reg_tokens": ("reg_token",),
    "pre_norm": ("norm_pre.",),
    "global_pool": ("attn_pool.",),  # "map"
    "distilled": ("dist_token", "head_dist."),
    "class_token": ("cls_token",),
}
# ViTConfig switches and their plain-ViT values: what sets a family apart from the plain ViT
PLAIN = dict(
    init_values=None,
    reg_tokens=0,
    no_embed_class=False,
    pre_norm=False,
    act_layer="gelu",
    mlp_layer="mlp",
    global_pool="token",
    class_token=True,
    distilled=False,
)


@dataclass(frozen=True)
class HFClass:
    """A transformers class a model is written as, and which of its outputs equals ours:
    "logits", "image_embeds" or "pooler_output" (our `model(x)`), or "last_hidden_state"
    (our `forward_features(x)`)."""

    name: str
    output: str


@dataclass(frozen=True)
class Family:
    """What the package knows about one family; `FAMILIES` below, one record each."""

    # the record's id (`family_of`; plain ViTs: "vit"); `vit.models.registry.ModelSpec.family`
    # groups more coarsely (its dinov2 holds dinov2_reg, deit undistilled DeiTs are "vit" here)
    name: str
    title: str
    switches: Mapping[str, Any]  # the ViTConfig fields that make it, with its presets' values
    is_member: Callable[[Any], bool]  # does a ViTConfig carry this family's switches
    readout: str  # which tokens the head reads
    layouts: tuple[str, ...]  # the `vit.interop.layouts` layouts that read its checkpoints
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN  # its weights' usual preprocessing
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD
    hf_layout: str | None = None  # the `vit.interop.layouts` module for its transformers folders
    hf_model_types: tuple[str, ...] = ()  # config.json model_types it is read from
    hf_with_head: HFClass | None = None  # written for num_classes > 0 (None: not representable)
    hf_headless: HFClass | None = None  # written for num_classes == 0
    hf_refusal: str = ""  # why transformers cannot hold it, when neither class can

    @property
    def tensors(self) -> tuple[str, ...]:
        """The tensors its switches create (key fragments)."""
        return tuple(t for switch in self.switches for t in SWITCH_TENSORS.get(switch, ()))

    def hf_class(self, num_classes: int) -> HFClass:
        """The transformers class a model of this family is written as, or a ValueError."""
        chosen = self.hf_with_head if num_classes else self.hf_headless
        if chosen is None:
            kind = "with a classifier head" if num_classes else "without a head (num_classes=0)"
            why = self.hf_refusal or f"no transformers class holds a {self.title} {kind}"
            if num_classes and self.hf_headless is not None:  # what it can hold instead
                why += "; its backbone can be written, without the head (num_classes=0)"
            raise ValueError(f"transformers cannot hold this {self.title} model: {why}")
        return chosen


VIT = Family(
    name="vit",
    title="plain ViT",
    switches={},
    is_member=lambda c: True,
    readout="the class token (global_pool='token') or the mean patch token ('avg')",
    layouts=("timm", "transformers", "torchvision", "google_jax"),
    mean=IMAGENET_INCEPTION_MEAN,
    std=IMAGENET_INCEPTION_STD,
    hf_layout="huggingface",
    hf_model_types=("vit",),
    hf_with_head=HFClass("ViTForImageClassification", "logits"),
    hf_headless=HFClass("ViTModel", "last_hidden_state"),
)
MAE = Family(  # a plain ViT, told apart by its name (a ".mae" tag, a "vit-mae" folder)
    name="mae",
    title="MAE encoder",
    switches={},
    is_member=lambda c: True,
    readout=VIT.readout,
    layouts=("timm", "transformers"),
    hf_layout="huggingface",
    hf_model_types=("vit_mae",),
    hf_with_head=VIT.hf_with_head,  # fine-tuned: a plain ViT classifier
    hf_headless=HFClass("ViTMAEModel", "last_hidden_state"),
)
DINOV2 = Family(
    name="dinov2",
    title="DINOv2",
    switches=dict(init_values=1e-5),
    is_member=lambda c: (
        bool(c.init_values) and c.class_token and not (c.no_embed_class or c.reg_tokens)
    ),
    readout="the class token",
    layouts=("timm", "transformers_dinov2", "dinov2"),
    hf_layout="hf_dinov2",
    hf_model_types=("dinov2",),
    hf_headless=HFClass("Dinov2Model", "last_hidden_state"),
    hf_refusal="transformers' DINOv2 classifiers read the class token and the mean patch token",
)
DINOV2_REG = Family(
    name="dinov2_reg",
    title="DINOv2 with registers",
    switches=dict(init_values=1e-5, reg_tokens=4, no_embed_class=True),
    is_member=lambda c: bool(c.init_values and c.reg_tokens and c.no_embed_class and c.class_token),
    readout="the class token (the registers are read by nothing)",
    layouts=("timm", "transformers_dinov2_reg", "dinov2"),
    hf_layout="hf_dinov2",
    hf_model_types=("dinov2_with_registers",),
    hf_headless=HFClass("Dinov2WithRegistersModel", "last_hidden_state"),
    hf_refusal=DINOV2.hf_refusal,
)
CLIP = Family(
    name="clip",
    title="CLIP image tower",
    switches=dict(pre_norm=True, norm_eps=1e-5),  # OpenAI's weights: act_layer="quick_gelu"
    is_member=lambda c: c.pre_norm,
    readout="the class token",
    layouts=("timm", "transformers_clip", "open_clip"),
    mean=OPENAI_CLIP_MEAN,
    std=OPENAI_CLIP_STD,
    hf_layout="hf_clip",
    hf_model_types=("clip", "clip_vision_model"),
    hf_with_head=HFClass("CLIPVisionModelWithProjection", "image_embeds"),  # head: projection
    hf_headless=HFClass("CLIPVisionModel", "pooler_output"),
)
SIGLIP = Family(
    name="siglip",
    title="SigLIP image tower",
    switches=dict(class_token=False, global_pool="map"),
    is_member=lambda c: not c.class_token and c.global_pool in ("map", ""),
    readout="an attention pool over the patch tokens (global_pool='map')",
    layouts=("timm", "transformers_siglip"),
    mean=IMAGENET_INCEPTION_MEAN,
    std=IMAGENET_INCEPTION_STD,
    hf_layout="hf_siglip",
    hf_model_types=("siglip", "siglip_vision_model"),
    hf_headless=HFClass("SiglipVisionModel", "pooler_output"),
    hf_refusal="SiglipForImageClassification reads the mean patch token",
)
DEIT = Family(  # DeiT without distillation is a plain ViT
    name="deit",
    title="distilled DeiT",
    switches=dict(distilled=True),
    is_member=lambda c: c.distilled,
    readout="the class and distillation tokens, averaged (one head each)",
    layouts=("timm", "transformers_deit"),
    hf_layout="hf_deit",
    hf_model_types=("deit",),
    hf_with_head=HFClass("DeiTForImageClassificationWithTeacher", "logits"),
)
DEIT3 = Family(
    name="deit3",
    title="DeiT III",
    switches=dict(init_values=1e-6, no_embed_class=True),
    is_member=lambda c: (
        bool(c.init_values) and c.class_token and c.no_embed_class and not c.reg_tokens
    ),
    readout="the class token",
    layouts=("timm",),
    hf_refusal="no transformers class has LayerScale with patch-only position embeddings",
)
# Most specific first: the first whose switches a config carries is its family. DINOv2 and
# DeiT III read a class token: timm's LayerScale ViTs without one (its "sbb" register ViTs, the
# patch tokens' mean) are plain ViTs here, as in timm.
FAMILIES: tuple[Family, ...] = (DEIT, SIGLIP, CLIP, DINOV2_REG, DEIT3, DINOV2, VIT)
BY_NAME = {family.name: family for family in (*FAMILIES, MAE)}
# transformers config.json model_type -> the family read from it
BY_MODEL_TYPE = {t: family for family in BY_NAME.values() for t in family.hf_model_types}


def family_of(config, model_name: str | None = None) -> Family:
    """The family of a `ViTConfig` (or of a model: its `.config` and `.model_name`). MAE has a
    plain ViT's switches: it is told by its name ("vit_base_patch16_224.mae", "vit-mae-base")."""
    if model_name is None:
        model_name = getattr(config, "model_name", None)
    config = getattr(config, "config", config)
    family = next(f for f in FAMILIES if f.is_member(config))
    if family is VIT and names_mae(model_name):
        return MAE
    return family


def names_mae(name: object) -> bool:
    """Whether a model name or weights path names an MAE encoder ("vit_base_patch16_224.mae",
    "facebook/vit-mae-base", "weights/mae_vitb.pth"): by its last part alone, as a folder
    above the weights ("/home/mae/") says nothing of them."""
    last = str(name or "").replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return "mae" in re.split(r"[^a-z0-9]+", last.lower())


def fine_tuning_pool(*names: object) -> str | None:
    """The readout a family's paper fine-tunes its pretrained encoder with, where it is not the
    weights' own: MAE (He et al. 2022) averages the patch tokens and normalises the mean
    (global_pool "avg", fc_norm), where its encoder was pretrained with a class token; it is
    told by any of `names` (the model name, the weights' path, the names the weights give
    themselves). None: the weights' own readout (DINO, DINOv2 and DeiT read the class token,
    CLIP its class token, SigLIP its attention pool)."""
    return "avg" if any(names_mae(name) for name in names) else None


def extra_switches(config) -> list[str]:
    """The switches of a `ViTConfig` that a plain ViT lacks, as `name=value` (for messages);
    the readout (global_pool, class_token) apart."""
    return [
        f"{name}={getattr(config, name)!r}"
        for name, plain in PLAIN.items()
        if name not in ("global_pool", "class_token") and getattr(config, name) != plain
    ]


@dataclass(frozen=True)
class Readout:
    """What a model's head reads. pool: "token" (the rows `tokens`, averaged), "avg" (the
    mean of the patch tokens), "map" (an attention pool over the patch tokens) or "" (every
    token, unpooled)."""

    pool: str
    tokens: tuple[int, ...] = ()  # for "token": the prefix rows the head averages


def readout_of(model) -> Readout:
    """The readout of a model (or a `ViTConfig`): the class token (0,), the class and
    distillation tokens (0, 1) of a distilled DeiT, the mean patch token, an attention pool."""
    config = getattr(model, "config", model)
    pool = getattr(model, "global_pool", config.global_pool)  # reset_classifier may change it
    if pool != "token":
        return Readout(pool)
    return Readout("token", (0, 1) if config.distilled else (0,))
