"""The original DINOv2 checkpoints (facebookresearch/dinov2: `dinov2_vits14_pretrain.pth`, ...,
and the `_reg4_` ones with registers).

Its `DinoVisionTransformer` already uses timm's names (`patch_embed.proj`, `blocks.{i}.attn.qkv`,
`blocks.{i}.ls1.gamma`, `norm`), plus a `mask_token` (used in training only; with the LayerScale
it tells this layout from timm's, and from MAE's pre-training checkpoints, whose mask token
sits beside blocks without LayerScale) and, with registers, `register_tokens`, which become timm's
`reg_token` with the class token's position embedding folded into the class token
(no_embed_class, as timm converts them). ViT-g/14's gated MLP (`mlp.w12`, gate then value, and
`mlp.w3`) is timm's `SwiGLUPacked` (`mlp.fc1`, `mlp.fc2`): renamed only.

Its position embeddings (518 px, 37x37) are resampled in every forward with bicubic
interpolation, no antialiasing, and a scale factor of (new + 0.1) / old instead of a target
size (a workaround for a rounding issue, kept for compatibility): loading records that, so a
model built at 224 px gives the original code's numbers.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import torch

from .hf_dinov2 import fold_class_position

# block_chunks > 0 (training checkpoints) nests blocks: blocks.{chunk}.{i}. with i global
CHUNKED = re.compile(r"^blocks\.\d+\.(\d+\.)")
SWIGLU = {".mlp.w12.": ".mlp.fc1.", ".mlp.w3.": ".mlp.fc2."}  # ViT-g/14's MLP -> timm's names


def matches(keys: Collection[str]) -> bool:
    # a mask token and LayerScale: MAE's pre-training checkpoints have a mask_token and
    # timm-named blocks too, but no LayerScale
    return "mask_token" in keys and any(
        key.startswith("blocks.") and key.endswith(".ls1.gamma") for key in keys
    )


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """facebookresearch/dinov2 names -> timm's: the mask token dropped, registers converted,
    ViT-g/14's MLP renamed."""
    out = {_timm_key(key): value for key, value in state.items()}
    out.pop("mask_token")
    notes = [f"{source}: ignored mask_token, DINOv2's masked-patch token (used in training only)"]
    if "register_tokens" in out:
        out["reg_token"] = out.pop("register_tokens")  # (1, R, D)
        notes.append(f"{source}: {fold_class_position(out)}")
    return out, notes


def _timm_key(key: str) -> str:
    key = CHUNKED.sub(r"blocks.\1", key)
    for theirs, ours in SWIGLU.items():
        key = key.replace(theirs, ours)
    return key
