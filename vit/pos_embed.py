"""Learned absolute position embeddings resampled to another patch grid.

A ViT trained at one image size runs at another by treating its grid of position embeddings
as a D-channel image and interpolating it. The model calls this for `dynamic_img_size`
inputs; loading weights calls it when a checkpoint's grid differs from the model's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["resample_abs_pos_embed"]


def resample_abs_pos_embed(
    posemb: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resize learned position embeddings (1, prefix + old_h*old_w, D) to a new patch grid.

    The prefix (class token) embeddings are kept as they are; the grid part is treated as a
    D-channel image and interpolated in float32 (bicubic in half precision is too coarse).
    Same semantics as timm's `resample_abs_pos_embed`.
    """
    num_new = new_size[0] * new_size[1] + num_prefix_tokens
    if num_new == posemb.shape[1] and new_size[0] == new_size[1]:
        return posemb
    if old_size is None:
        side = math.isqrt(posemb.shape[1] - num_prefix_tokens)
        old_size = (side, side)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    if old_size[0] * old_size[1] != grid.shape[1]:
        raise ValueError(
            f"position embedding has {grid.shape[1]} grid tokens, which is not a "
            f"{old_size[0]}x{old_size[1]} grid; pass old_size=(grid_h, grid_w)"
        )
    dim, dtype = posemb.shape[-1], posemb.dtype
    grid = grid.float().reshape(1, old_size[0], old_size[1], dim)  # (1, h, w, D)
    grid = grid.permute(0, 3, 1, 2)  # channels first for F.interpolate: (1, D, h, w)
    grid = F.interpolate(grid, size=new_size, mode=interpolation, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)  # (1, new_h*new_w, D)
    return torch.cat([prefix, grid], dim=1)
