"""Learned absolute position embeddings resampled to another patch grid.

A ViT trained at one image size runs at another by treating its grid of position embeddings
as a D-channel image and interpolating it. The model calls this for `dynamic_img_size`
inputs; loading weights calls it when a checkpoint's grid differs from the model's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["RESAMPLERS", "resample_abs_pos_embed", "resample_pos_embed"]


def resamples_always(method: str = "timm") -> bool:
    """Whether to resample even to the grid the embeddings have: while torch.export traces, as
    a branch on the input's size would fix the exported program to the example's size (a
    guard) where a model with dynamic_img_size takes any. timm's and transformers' resampling
    give an unchanged grid back as it was; the original DINOv2's moves its sample points (its
    offset), so it keeps its shortcut, and its export is traced at another size (vit.export
    traces so)."""
    return method != "dinov2" and torch.compiler.is_exporting()


def unchanged_grid(
    posemb: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None,
    num_prefix_tokens: int,
    method: str = "timm",
) -> bool:
    """Whether `new_size` is the grid `posemb` already has, so that resampling is skipped (as
    timm and transformers skip it): `old_size` itself, or where it is not given (a square grid
    assumed), a square grid of as many tokens. (As many tokens alone is not enough: a 2x8 grid
    read as 4x4 would scramble the positions.) Never while torch.export traces, asked first:
    comparing the traced sizes would fix an exported program to them (`resamples_always`)."""
    if resamples_always(method):
        return False
    if posemb.shape[1] != new_size[0] * new_size[1] + num_prefix_tokens:
        return False
    if old_size is None:
        return new_size[0] == new_size[1]
    return tuple(old_size) == tuple(new_size)


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
    if unchanged_grid(posemb, new_size, old_size, num_prefix_tokens):
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


# -- resampling as the library the weights come from does it --------------------------------------
# Bicubic resampling is not one function: antialiasing (a wider, PIL-like kernel) and asking for
# a scale factor instead of a size both change the numbers, so weights loaded at another image
# size reproduce their source only when resampled the source's way. A checkpoint's layout
# records which of these its weights need (`vit.interop.layouts.Layout.pos_embed`).
RESAMPLERS = {
    # timm, OpenCLIP and transformers' DINOv2 with registers
    "timm": "bicubic, antialiased, to the new size: timm's",
    # transformers' interpolate_pos_encoding (DINOv2, CLIP, SigLIP, ViT, DeiT)
    "transformers": "bicubic, not antialiased, to the new size: transformers'",
    # facebookresearch/dinov2's interpolate_offset: every sample point moves a little
    "dinov2": "bicubic, not antialiased, by a scale factor (new + 0.1) / old: original DINOv2's",
    # torchvision's interpolate_embeddings: the grid's corner points stay where they were
    "torchvision": "bicubic, not antialiased, corners aligned, to the new size: torchvision's",
}


def resample_pos_embed(
    posemb: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    method: str = "timm",
) -> torch.Tensor:
    """`resample_abs_pos_embed` as the library named by `method` does it (see `RESAMPLERS`):
    the same weights then give that library's numbers at the new size."""
    if method not in RESAMPLERS:
        raise ValueError(f"unknown pos_embed resampling {method!r}; accepted: {sorted(RESAMPLERS)}")
    if method == "timm":
        return resample_abs_pos_embed(posemb, new_size, old_size, num_prefix_tokens)
    if unchanged_grid(posemb, new_size, old_size, num_prefix_tokens, method):
        return posemb
    old_size = old_size or (math.isqrt(posemb.shape[1] - num_prefix_tokens),) * 2
    if method in ("transformers", "torchvision"):
        interpolate = dict(size=tuple(new_size), align_corners=method == "torchvision")
    else:  # the original DINOv2: the offset moves every sample point a little
        scale = tuple((new + 0.1) / old for new, old in zip(new_size, old_size, strict=True))
        interpolate = dict(scale_factor=scale)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim, dtype = posemb.shape[-1], posemb.dtype
    grid = grid.float().reshape(1, *old_size, dim).permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = F.interpolate(grid, mode="bicubic", antialias=False, **interpolate)
    if tuple(grid.shape[-2:]) != tuple(new_size):
        raise ValueError(f"resampled to a {tuple(grid.shape[-2:])} grid, expected {new_size}")
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)  # (1, new_h*new_w, D)
    return torch.cat([prefix, grid], dim=1)
