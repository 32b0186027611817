"""transformers' distilled DeiT (`DeiTForImageClassificationWithTeacher`).

The encoder is transformers' plain ViT under `deit.`, plus a distillation token after the class
token (`distillation_token` -> timm's `dist_token`; the position embeddings cover both) and a
second head reading it (`distillation_classifier` -> `head_dist`). At inference the logits are
the mean of both heads, in transformers as in timm's `VisionTransformerDistilled`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import torch

from . import huggingface as vit_layout
from .hf_common import (
    backbone_config,
    backbone_to_hf,
    check_switches,
    convert,
    from_timm,
    labels_to_hf,
    prefixed,
)
from .keymap import KeyMap
from .refused import SUPPORTED

PREFIX = "deit."
KEYS = KeyMap(
    [
        *prefixed(PREFIX, vit_layout.KEYS.pairs),
        (PREFIX + "embeddings.distillation_token", "dist_token"),
        ("cls_classifier.", "head."),
        ("distillation_classifier.", "head_dist."),
    ]
)
IGNORED = {
    PREFIX + "embeddings.mask_token": "the masked-image-modelling mask token (unused here)",
    PREFIX + "pooler.dense.weight": "DeiTModel's tanh pooler (the heads read the tokens)",
    PREFIX + "pooler.dense.bias": None,
}
ARCHITECTURE = "DeiTForImageClassificationWithTeacher"


def default_processor(img_size: tuple[int, int]) -> dict:
    """The preprocessing of a folder saved without preprocessor_config.json, not
    ViTImageProcessor's: DeiTImageProcessor's defaults (both sides resized to 256 / 224 of the
    input, bicubic, the centre crop, statistics 0.5) at config.json's image_size."""
    return {
        "size": {"height": img_size[0] * 256 // 224, "width": img_size[1] * 256 // 224},
        "crop_size": {"height": img_size[0], "width": img_size[1]},
        "do_center_crop": True,
        "resample": 3,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


def matches(keys: Collection[str]) -> bool:
    return any(key.endswith("embeddings.distillation_token") for key in keys)


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """transformers' DeiT names -> timm's distilled ViT (`dist_token`, `head_dist`)."""
    if not any(key.startswith("distillation_classifier.") for key in state):
        raise ValueError(
            f"{source} is a transformers DeiT with a distillation token but no distillation "
            f"head (DeiTModel or DeiTForImageClassification): not supported; supported: "
            f"{SUPPORTED}"
        )
    qkv = re.escape(PREFIX) + vit_layout.QKV_BODY
    return convert(state, source, "distilled DeiT", KEYS, qkv, IGNORED)


def config_from_hf(hf_config: dict, source: str) -> tuple[dict, list[str] | None]:
    """A transformers DeiT `config.json` -> (our `ViTConfig` arguments without heads, None);
    the heads and class names are the weights' and id2label's (`hf_common.classifier_of`)."""
    architectures = hf_config.get("architectures") or []
    if architectures != [ARCHITECTURE]:
        listed = ", ".join(architectures) or "no architectures listed"
        raise ValueError(
            f"{source} holds a transformers DeiT ({listed}); only {ARCHITECTURE} (both heads) is "
            f"supported; supported: {SUPPORTED}"
        )
    config = dict(
        backbone_config(hf_config, source),
        num_classes=0,  # a folder's heads are sized by its weights: hf_common.classifier_of
        qkv_bias=bool(hf_config.get("qkv_bias", True)),
        distilled=True,
    )
    return config, None


def write_state(state: Mapping[str, torch.Tensor], hf_class: str) -> dict[str, torch.Tensor]:
    """timm's distilled ViT -> transformers' DeiTForImageClassificationWithTeacher names."""
    qkv = PREFIX + vit_layout.QKV_FILE
    return from_timm(state, KEYS, qkv, vit_layout.QKV_PARTS, ARCHITECTURE)


def write_config(config, hf_class: str, class_names: list[str] | None) -> dict:
    """Our distilled config -> DeiTForImageClassificationWithTeacher's `config.json`."""
    why = "transformers' DeiT reads the class and distillation tokens after the final LayerNorm"
    check_switches(config, "DeiT", why, distilled=True)
    return {
        "architectures": [hf_class],
        "model_type": "deit",
        **backbone_to_hf(config),
        "qkv_bias": config.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        **labels_to_hf(class_names, config.num_classes),
    }
