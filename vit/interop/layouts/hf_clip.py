"""transformers' CLIP image tower: `CLIPVisionModel`, `CLIPVisionModelWithProjection` and the
vision half of `CLIPModel`.

A ViT with a LayerNorm after the position embeddings (`pre_layrnorm`, sic -> timm's `norm_pre`;
the patch projection has no bias), QuickGELU (OpenAI's weights) and LayerNorm eps 1e-5. The
pooled output is the class token after `post_layernorm` (timm's `norm`); the projection to the
joint image-text space (`visual_projection`, no bias) becomes timm's `head` with a zero bias,
so `model(x)` is `image_embeds`, as timm does for OpenAI's CLIP. The text tower is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import torch

from . import hf_common as hf
from .keymap import KeyMap
from .refused import SUPPORTED

BLOCK = "encoder.layers.{i}."
# the encoder layers, shared with SigLIP's tower
BLOCK_PAIRS = [
    (BLOCK + "layer_norm1.", "blocks.{i}.norm1."),
    (BLOCK + "self_attn.out_proj.", "blocks.{i}.attn.proj."),
    (BLOCK + "layer_norm2.", "blocks.{i}.norm2."),
    (BLOCK + "mlp.fc1.", "blocks.{i}.mlp.fc1."),
    (BLOCK + "mlp.fc2.", "blocks.{i}.mlp.fc2."),
]
QKV_BODY = (
    r"encoder\.layers\.(?P<block>\d+)\.self_attn\.(?P<part>[qkv])_proj\.(?P<kind>weight|bias)$"
)
PAIRS = [
    ("embeddings.class_embedding", "cls_token"),
    ("embeddings.patch_embedding.", "patch_embed.proj."),
    ("embeddings.position_embedding.weight", "pos_embed"),
    ("pre_layrnorm.", "norm_pre."),
    *BLOCK_PAIRS,
    ("post_layernorm.", "norm."),
]
IGNORED = {"embeddings.position_ids": None}  # a buffer older transformers saved
PATCH_KEY = "embeddings.patch_embedding.weight"
PROJECTION = "visual_projection.weight"  # CLIP's, beside the tower
QKV_FILE, QKV_PARTS = BLOCK + "self_attn.{part}.{kind}", ("q_proj", "k_proj", "v_proj")
# transformers' CLIPVisionConfig defaults
DEFAULTS = {**hf.DEFAULTS, "patch_size": 32, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
ARCHITECTURES = ("CLIPVisionModel", "CLIPVisionModelWithProjection", "CLIPModel")


def default_processor(img_size: tuple[int, int]) -> dict:
    """The preprocessing of a folder saved without preprocessor_config.json, not
    ViTImageProcessor's (mean 0.5, bilinear): CLIPImageProcessor's defaults (the shorter side
    resized, bicubic, a centre crop, OpenAI's statistics) at config.json's image_size, as the
    published processors are (224 and 336 px: shortest_edge = crop_size = image_size)."""
    return {
        "size": {"shortest_edge": min(img_size)},
        "crop_size": {"height": img_size[0], "width": img_size[1]},
        "do_center_crop": True,
        "resample": 3,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }


def matches(keys: Collection[str]) -> bool:
    return any(key.endswith("embeddings.class_embedding") for key in keys)


def tower(
    state: Mapping[str, torch.Tensor], source: str
) -> tuple[str, dict[str, torch.Tensor], list[str]]:
    """(key prefix of the image tower, the state without what lies outside it, notes).

    The tower is wherever its patch embedding is: at the top (`CLIPVisionModel`), under
    `vision_model.` (`CLIPModel`, `SiglipModel`) or deeper (a vision-language model's
    `vision_tower.vision_model.`); the rest (a text tower, a language model) is dropped."""
    patch = next(key for key in state if key.endswith(PATCH_KEY))
    prefix = patch[: -len(PATCH_KEY)]
    if any(key.startswith("classifier.") for key in state):
        raise ValueError(
            f"{source} is a transformers image classifier on the mean of CLIP/SigLIP patch "
            f"tokens (*ForImageClassification): not supported; supported: {SUPPORTED}"
        )
    kept = {k: v for k, v in state.items() if k.startswith(prefix) or k == PROJECTION}
    outside = [key for key in state if key not in kept]
    notes = []
    if outside:
        notes.append(
            f"{source}: ignored {len(outside)} tensors outside the image tower {prefix}* (a "
            f"text tower or language model: {outside[0]}, ...)"
        )
    return prefix, kept, notes


def vector_shapes(out: dict[str, torch.Tensor]) -> None:
    """transformers keeps the class token as (D,) and position embeddings as (N, D); timm as
    (1, 1, D) and (1, N, D). In place."""
    if "cls_token" in out:
        out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
    out["pos_embed"] = out["pos_embed"].unsqueeze(0)


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """transformers' CLIP image tower -> timm's names (projection -> head, zero bias)."""
    prefix, state, notes = tower(state, source)
    keys = KeyMap([*hf.prefixed(prefix, PAIRS), (PROJECTION, "head.weight")])
    ignored = {prefix + name: note for name, note in IGNORED.items()}
    qkv = re.escape(prefix) + QKV_BODY
    out, more = hf.convert(state, source, "CLIP image tower", keys, qkv, ignored)
    vector_shapes(out)
    if "head.weight" in out:
        out["head.bias"] = torch.zeros(out["head.weight"].shape[0])  # the projection has none
    return out, notes + more


def vision_config(hf_config: dict, source: str) -> tuple[dict, list[str]]:
    """(the image tower's config, the architectures) of a tower or a two-tower config."""
    architectures = hf_config.get("architectures") or []
    if "vision_config" in hf_config:  # CLIPModel / SiglipModel: the towers' configs nested
        return {**hf_config["vision_config"]}, architectures
    return hf_config, architectures


def config_from_hf(hf_config: dict, source: str) -> tuple[dict, None]:
    """A transformers CLIP `config.json` -> our `ViTConfig` arguments. With a projection
    (`CLIPVisionModelWithProjection`, `CLIPModel`) the head is the projection: num_classes is
    projection_dim and model(x) is image_embeds; without, model(x) is pooler_output."""
    vision, architectures = vision_config(hf_config, source)
    other = [a for a in architectures if a not in ARCHITECTURES]
    if other:
        raise ValueError(f"{source} holds a {other[0]}; supported: {SUPPORTED}")
    projected = any(a in ("CLIPVisionModelWithProjection", "CLIPModel") for a in architectures)
    projection_dim = hf_config.get("projection_dim", vision.get("projection_dim", 512))
    config = dict(
        hf.backbone_config(vision, source, DEFAULTS),
        num_classes=int(projection_dim) if projected else 0,
        pre_norm=True,
    )
    return config, None


def write_tower(state: Mapping[str, torch.Tensor], keys: KeyMap, prefix: str, what: str) -> dict:
    """timm names -> a CLIP or SigLIP image tower's under `prefix` (`keys` carrying it), the
    class token and position embeddings in transformers' shapes (D,) and (N, D)."""
    state = dict(state)
    if "cls_token" in state:
        state["cls_token"] = state["cls_token"].reshape(-1)  # (D,)
    state["pos_embed"] = state["pos_embed"][0]  # (N, D)
    return hf.from_timm(state, keys, prefix + QKV_FILE, QKV_PARTS, what)


def write_state(state: Mapping[str, torch.Tensor], hf_class: str) -> dict[str, torch.Tensor]:
    """timm names -> CLIPVisionModel's, or CLIPVisionModelWithProjection's (under
    "vision_model.", the head as `visual_projection`, which has no bias: a head whose bias is
    not zero is refused)."""
    state = dict(state)
    projected = hf_class == "CLIPVisionModelWithProjection"
    if projected:
        bias = state.pop("head.bias")
        if bias.abs().max() > 0:
            raise ValueError(
                "transformers' CLIPVisionModelWithProjection cannot hold this model: its head "
                "has a bias, and CLIP's projection has none (CLIPForImageClassification reads "
                "the mean patch token)"
            )
    prefix = "vision_model." if projected else ""
    keys = KeyMap([*hf.prefixed(prefix, PAIRS), (PROJECTION, "head.weight")])
    return write_tower(state, keys, prefix, hf_class)


def write_config(config, hf_class: str, class_names: list[str] | None) -> dict:
    """Our CLIP config -> CLIPVisionModel's or CLIPVisionModelWithProjection's `config.json`
    (the head's width is projection_dim)."""
    why = "transformers' CLIP has a LayerNorm before the blocks and reads the class token"
    hf.check_switches(config, "CLIP", why, pre_norm=True)
    if not config.qkv_bias:
        raise ValueError("transformers' CLIP cannot hold this model: it has qkv_bias=False")
    out = {"architectures": [hf_class], "model_type": "clip_vision_model"}
    out.update(hf.backbone_to_hf(config), attention_dropout=0.0)
    if config.num_classes:
        out["projection_dim"] = config.num_classes
    return out
