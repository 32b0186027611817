"""What a model's head reads, asked of the model rather than assumed: its register tokens, the
token rows a class-token head reads, and the patch grid of an input.

Prefix tokens come first in the sequence: the class token, a distillation token (DeiT), then
the register tokens (DINOv2 with registers); the patches follow in row-major order.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.families import readout_of


def num_registers(model: nn.Module) -> int:
    """How many register tokens (DINOv2 with registers) the model has: the last prefix tokens."""
    count = getattr(model, "num_reg_tokens", None)  # timm's attribute name
    if count is None:
        count = getattr(getattr(model, "config", None), "reg_tokens", 0)
    return int(count or 0)


EXPLAINED_POOLS = ("token", "avg", "map")  # readouts whose attention rows a map can follow


def unexplained_readout(model: nn.Module) -> str | None:
    """Why the model's readout cannot be explained (no rows of attention it reads: a max pool,
    or no pooling at all), or None where it can."""
    pool = readout_of(model).pool
    if pool in EXPLAINED_POOLS:
        return None
    return (
        f"global_pool={pool!r}: explanations follow the rows of attention the head reads, and "
        "this readout has none; they need global_pool 'token', 'avg' or 'map'"
    )


def readout_tokens(model: nn.Module) -> list[int]:
    """The token rows a class-token head reads, as the model's family record says
    (`vit.models.families.readout_of`): the class token (0), and for a distilled model (DeiT) the
    distillation token (1) too, because its two heads' outputs are averaged; [] for a model
    that does not read prefix tokens (mean or attention pooling)."""
    return list(readout_of(model).tokens)


def grid_of(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """The patch grid (gh, gw) of `images` (B, C, H, W): the model's own, or another size's
    when the model resamples its position embeddings (dynamic_img_size)."""
    ph, pw = model.patch_embed.patch_size
    return images.shape[-2] // ph, images.shape[-1] // pw
