"""Checkpoint layouts: how other libraries name a ViT's tensors, mapped onto timm's names.

A layout is one small module: a test on the key names (`matches`), a key map to timm's names
(`to_timm`) and, where export needs it, the map back (`from_timm`). Adding a layout means
adding a module and listing it in `LAYOUTS`; reading files (safetensors, torch pickles, npz)
is `vit.interop.weights`' job and knows nothing about layouts. Each layout also says what its
weights need beyond names: the LayerNorm eps they were trained with and how their position
embeddings are resampled to another image size (`vit.models.pos_embed.RESAMPLERS`).

    timm         patch_embed.proj.weight, blocks.0.attn.qkv.weight, ...   (ours: no mapping;
                 facebookresearch/mae's mask_token and decoder_* dropped)
    transformers vit.embeddings.patch_embeddings.projection.weight, vit.encoder.layer.0. ...
                 (+ DINOv2 layer_scale1, DeiT distillation_token, CLIP class_embedding,
                 SigLIP embeddings.patch_embedding without a class token)
    dinov2       mask_token, blocks.0.ls1.gamma, register_tokens (facebookresearch/dinov2)
    open_clip    visual.conv1.weight, visual.transformer.resblocks.0. ... (OpenAI, OpenCLIP)
    torchvision  conv_proj.weight, encoder.layers.encoder_layer_0.self_attention.in_proj_weight
    google_jax   embedding/kernel, Transformer/encoderblock_0/... (vit_jax and big_vision .npz)

The transformers layouts (`huggingface`: ViT and MAE; `hf_deit`, `hf_dinov2`, `hf_clip`,
`hf_siglip`) also write their family's class for export (`write_config`, `write_state`), and
share `hf_common`; `vit.models.families` says which family each reads and writes.

Families this package cannot compute (EVA, DINOv3, AIMv2) are recognised first and refused
(`refused`); so are transformers configs of other models (`config_from_transformers`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch

from ...models import families
from . import (
    dinov2,
    google_jax,
    hf_clip,
    hf_deit,
    hf_dinov2,
    hf_siglip,
    huggingface,
    open_clip,
    refused,
    torchvision,
)
from .keymap import KeyMap

__all__ = ["LAYOUTS", "KeyMap", "Layout", "config_from_transformers", "detect", "to_timm"]


@dataclass(frozen=True)
class Layout:
    """One checkpoint naming scheme and its conversion to timm's names."""

    name: str
    example_key: str  # a key every checkpoint of this layout has, shown in error messages
    matches: Callable[[Collection[str]], bool]
    # (state dict, source description) -> (timm-named state dict, notes for the user)
    to_timm: Callable[[Mapping[str, torch.Tensor], str], tuple[dict, list[str]]]
    norm_eps: float | None = None  # LayerNorm eps its checkpoints use, when the keys tell
    # how the source library resamples its position embeddings (a `vit.models.pos_embed` resampler)
    pos_embed: str = "timm"
    # (input size (H, W), patch size (h, w)) -> `vit.Preprocess` fields, where the layout's
    # weights expect their own preprocessing rather than the model name's (torchvision's)
    preprocess: Callable[[tuple[int, int], tuple[int, int]], dict] | None = None


_TIMM_ROOTS = ("patch_embed.", "blocks.", "cls_token", "pos_embed", "norm.", "head.", "fc_norm.")


def _is_timm(keys: Collection[str]) -> bool:
    return any(key.startswith(_TIMM_ROOTS) for key in keys)


def _timm_to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """timm names already; facebookresearch/mae's pre-training checkpoints (`mae_visualize_*`)
    add a mask token and a decoder (`decoder_*`) beside the encoder: dropped, with a note."""
    if not any(key.startswith("decoder_") for key in state):
        return dict(state), []
    kept = {k: v for k, v in state.items() if not k.startswith("decoder_") and k != "mask_token"}
    return kept, [f"{source}: ignored MAE's mask token and decoder (decoder_*, pre-training only)"]


# transformers resamples with `interpolate_pos_encoding` (bicubic to a size, no antialias),
# except for DINOv2 with registers (antialiased, as timm).
LAYOUTS: tuple[Layout, ...] = (
    Layout("timm", "patch_embed.proj.weight", _is_timm, _timm_to_timm),
    Layout(
        "transformers_dinov2_reg",
        "embeddings.register_tokens",
        lambda keys: hf_dinov2.matches(keys) and hf_dinov2.has_registers(keys),
        hf_dinov2.to_timm,
        norm_eps=1e-6,
        pos_embed="timm",  # transformers' DINOv2 with registers resamples with antialiasing
    ),
    Layout(
        "transformers_dinov2",
        "encoder.layer.0.layer_scale1.lambda1",
        hf_dinov2.matches,
        hf_dinov2.to_timm,
        norm_eps=1e-6,
        pos_embed="transformers",
    ),
    Layout(
        "transformers_deit",
        "deit.embeddings.distillation_token",
        hf_deit.matches,
        hf_deit.to_timm,
        norm_eps=1e-12,
        pos_embed="transformers",
    ),
    Layout(
        "transformers",
        "vit.embeddings.patch_embeddings.projection.weight",
        huggingface.matches,
        huggingface.to_timm,
        norm_eps=1e-12,
        pos_embed="transformers",
    ),
    Layout(
        "transformers_clip",
        "vision_model.embeddings.class_embedding",
        hf_clip.matches,
        hf_clip.to_timm,
        norm_eps=1e-5,
        pos_embed="transformers",
    ),
    Layout(
        "transformers_siglip",
        "vision_model.embeddings.patch_embedding.weight",
        hf_siglip.matches,
        hf_siglip.to_timm,
        norm_eps=1e-6,
        pos_embed="transformers",
    ),
    Layout(
        "dinov2",
        "mask_token",
        dinov2.matches,
        dinov2.to_timm,
        norm_eps=1e-6,
        pos_embed="dinov2",
    ),
    Layout("open_clip", "visual.conv1.weight", open_clip.matches, open_clip.to_timm, 1e-5),
    Layout(
        "torchvision",
        "encoder.layers.encoder_layer_0.self_attention.in_proj_weight",
        torchvision.matches,
        torchvision.to_timm,
        pos_embed="torchvision",
        preprocess=torchvision.preprocess_for,
    ),
    Layout("google_jax", "embedding/kernel", google_jax.matches, google_jax.to_timm),
)
BY_NAME = {layout.name: layout for layout in LAYOUTS}
# transformers config.json model_type -> the layout module that reads its config (its family's)
CONFIGS = {
    model_type: importlib.import_module(f".{family.hf_layout}", __name__)
    for model_type, family in families.BY_MODEL_TYPE.items()
}


def detect(keys: Collection[str], source: str) -> Layout:
    """The layout whose key names these are, or a ValueError naming a family this package
    cannot compute, or listing the supported layouts."""
    refused.check_keys(keys, source)
    for layout in LAYOUTS[1:]:  # the others first: timm's test is the loosest
        if layout.matches(keys):
            return layout
    if _is_timm(keys):
        return LAYOUTS[0]
    shown = sorted(keys)[:6]
    supported = "; ".join(f"{layout.name} ({layout.example_key})" for layout in LAYOUTS)
    raise ValueError(
        f"{source}: unknown checkpoint layout, not a ViT this package can read (first keys: "
        f"{shown}). Supported layouts, by a key each has: {supported}. Families: "
        f"{refused.SUPPORTED}"
    )


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, str, list[str]]:
    """Any supported layout -> (timm-named state dict, layout name, notes on what was done)."""
    layout = detect(list(state), source)
    state_dict, notes = layout.to_timm(state, source)
    return state_dict, layout.name, notes


def config_from_transformers(hf: dict, source: str) -> tuple[dict, list[str] | None]:
    """A transformers `config.json` (as a dict) -> (our `ViTConfig` arguments, class names or
    None), or a ValueError naming the model it holds and the supported ones."""
    model_type = hf.get("model_type")
    refused.check_model_type(model_type, source)
    if model_type not in CONFIGS:
        listed = ", ".join(hf.get("architectures") or []) or "no architectures listed"
        raise ValueError(
            f"{source} holds a transformers '{model_type}' model ({listed}), not one of the ViTs "
            f"this package computes; supported: {refused.SUPPORTED}"
        )
    return CONFIGS[model_type].config_from_hf(hf, source)
