"""Checkpoint layouts: how other libraries name a ViT's tensors, mapped onto timm's names.

A layout is one small module: a test on the key names (`matches`), a key map to timm's names
(`to_timm`) and, where export needs it, the map back (`from_timm`). Adding a layout means
adding a module and listing it in `LAYOUTS`; reading files (safetensors, torch pickles, npz)
is `vit.weights`' job and knows nothing about layouts.

    timm         patch_embed.proj.weight, blocks.0.attn.qkv.weight, ...   (ours: no mapping)
    transformers vit.embeddings.patch_embeddings.projection.weight, vit.encoder.layer.0. ...
    torchvision  conv_proj.weight, encoder.layers.encoder_layer_0.self_attention.in_proj_weight
    google_jax   embedding/kernel, Transformer/encoderblock_0/... (vit_jax and big_vision .npz)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch

from . import google_jax, huggingface, torchvision
from .keymap import KeyMap

__all__ = ["LAYOUTS", "KeyMap", "Layout", "detect", "to_timm"]


@dataclass(frozen=True)
class Layout:
    """One checkpoint naming scheme and its conversion to timm's names."""

    name: str
    example_key: str  # a key every checkpoint of this layout has, shown in error messages
    matches: Callable[[Collection[str]], bool]
    # (state dict, source description) -> (timm-named state dict, notes for the user)
    to_timm: Callable[[Mapping[str, torch.Tensor], str], tuple[dict, list[str]]]


_TIMM_ROOTS = ("patch_embed.", "blocks.", "cls_token", "pos_embed", "norm.", "head.", "fc_norm.")


def _is_timm(keys: Collection[str]) -> bool:
    return any(key.startswith(_TIMM_ROOTS) for key in keys)


LAYOUTS: tuple[Layout, ...] = (
    Layout("timm", "patch_embed.proj.weight", _is_timm, lambda sd, source: (dict(sd), [])),
    Layout(
        "transformers",
        "vit.embeddings.patch_embeddings.projection.weight",
        huggingface.matches,
        huggingface.to_timm,
    ),
    Layout(
        "torchvision",
        "encoder.layers.encoder_layer_0.self_attention.in_proj_weight",
        torchvision.matches,
        torchvision.to_timm,
    ),
    Layout("google_jax", "embedding/kernel", google_jax.matches, google_jax.to_timm),
)


def detect(keys: Collection[str], source: str) -> Layout:
    """The layout whose key names these are, or a ValueError listing the supported ones."""
    for layout in LAYOUTS[1:]:  # the others first: timm's test is the loosest
        if layout.matches(keys):
            return layout
    if _is_timm(keys):
        return LAYOUTS[0]
    shown = sorted(keys)[:6]
    supported = "; ".join(f"{layout.name} ({layout.example_key})" for layout in LAYOUTS)
    raise ValueError(
        f"{source}: unknown checkpoint layout, not a ViT this package can read (first keys: "
        f"{shown}). Supported layouts, by a key each has: {supported}"
    )


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, str, list[str]]:
    """Any supported layout -> (timm-named state dict, layout name, notes on what was done)."""
    layout = detect(list(state), source)
    state_dict, notes = layout.to_timm(state, source)
    return state_dict, layout.name, notes
