"""Which patches mattered to a model's output: maps of shape (B, gh, gw), batched, for every
family the model expresses (class token or none, registers, a distillation token, average or
attention-pool readout), plus the DINO picture, `last_block_attention`, one map per head, and
the heads' mean attention distance.

* `attention_rollout` (Abnar & Zuidema 2020): the attention of all blocks rolled out.
* `gradient_rollout` (jacobgil's vit-explain): the same on attention weighted by the gradient
  of a class logit, so the map is class-specific.
* `relevance` (Chefer, Gur & Wolf 2021): gradient-times-attention relevance.
(The arithmetic of each is in `vit.explain.rollout`.)

The map is read where the head reads: the class token's row (with a distillation token, the
mean of both rows), the mean of the patch rows for global_pool="avg", or the attention pool's
weights over the tokens for global_pool="map". Register tokens can be left out
(`include_registers=False`). A headless backbone has no class to explain: the gradient methods
then take a `direction` in embedding space (another image's embedding; with
`pre_logits=False` in the head's output space, a CLIP text embedding) and explain the cosine (or
dot-product) similarity of each image's embedding to it.

Each function runs one forward pass (plus one backward for the gradient methods) through
`vit.explain.capture.record_attention`: in eval mode with the explicit attention path switched
on, both settings restored afterwards.

Shape legend: B batch, nh heads, N tokens (prefix + gh*gw), P prefix tokens (class,
distillation, registers), gh/gw grid, L the attention pool's latent queries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models.families import readout_of
from .capture import AttentionRecord, Similarity, Target, record_attention
from .readout import grid_of, num_registers, readout_tokens, unexplained_readout
from .rollout import (
    HeadFusion,
    drop_tokens,
    fuse_heads,
    gradient_rollout_matrix,
    patch_map,
    relevance_matrix,
    rollout_matrix,
)


@dataclass
class _Prepared:
    """A record made ready for a map: registers dropped if asked, and how the head reads."""

    attentions: list[torch.Tensor]  # depth (B, nh, N, N)
    gradients: list[torch.Tensor] | None  # depth (B, nh, N, N)
    pool_attention: torch.Tensor | None  # (B, nh, L, N)
    pool_gradient: torch.Tensor | None  # (B, nh, L, N)
    num_prefix_tokens: int
    grid_size: tuple[int, int]
    global_pool: str
    readout_tokens: list[int]


def _prepare(
    model: nn.Module, images: torch.Tensor, record: AttentionRecord, include_registers: bool
) -> _Prepared:
    prefix = model.num_prefix_tokens
    attentions, gradients = record.attentions, record.gradients
    pool_attention, pool_gradient = record.pool_attention, record.pool_gradient
    n = attentions[0].shape[-1]
    if pool_attention is not None and pool_attention.shape[-1] == n - prefix != n:
        # a pool over the patch tokens only: the prefix tokens get no weight
        pool_attention = F.pad(pool_attention, (prefix, 0))
        pool_gradient = None if pool_gradient is None else F.pad(pool_gradient, (prefix, 0))
    registers = num_registers(model)
    if not include_registers and registers:
        dropped = range(prefix - registers, prefix)  # registers are the last prefix tokens
        attentions = [drop_tokens(a, dropped) for a in attentions]
        if gradients is not None:
            gradients = [drop_tokens(g, dropped, renormalize=False) for g in gradients]
        if pool_attention is not None:
            pool_attention = drop_tokens(pool_attention, dropped)
        if pool_gradient is not None:
            pool_gradient = drop_tokens(pool_gradient, dropped, renormalize=False)
        prefix -= registers
    global_pool = readout_of(model).pool
    problem = unexplained_readout(model)
    if problem:
        raise ValueError(problem)
    if global_pool == "map" and pool_attention is None:
        raise ValueError("global_pool='map' but no attention-pool probabilities were captured")
    return _Prepared(
        attentions,
        gradients,
        pool_attention,
        pool_gradient,
        prefix,
        grid_of(model, images),
        global_pool,
        readout_tokens(model),
    )


def _normalized(row: torch.Tensor) -> torch.Tensor:
    """Rows (B, N) divided by their sums; an all-zero row stays zero."""
    return row / row.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(row.dtype).tiny)


def _readout(prep: _Prepared, pool_row: torch.Tensor | None) -> str | torch.Tensor:
    """How the head reads the final tokens, for `patch_map`: "avg", or weights (B or 1, N).

    pool_row (B, N): the attention pool's weights over the tokens, as the method sees them."""
    if prep.global_pool == "avg":
        return "avg"
    if prep.global_pool == "map":
        return pool_row
    if prep.num_prefix_tokens == 0:
        raise ValueError("global_pool='token' needs a class token; this model has none")
    n = prep.attentions[0].shape[-1]
    weights = torch.zeros(1, n, dtype=prep.attentions[0].dtype, device=prep.attentions[0].device)
    weights[:, prep.readout_tokens] = 1 / len(prep.readout_tokens)
    return weights  # (1, N)


def attention_rollout(
    model: nn.Module,
    images: torch.Tensor,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    *,
    include_registers: bool = True,
) -> torch.Tensor:
    """Raw attention rollout of the classifier's readout to every patch: (B, gh, gw).

    images: (B, C, H, W), normalised as the model expects. head_fusion: how each layer's heads
    are combined. discard_ratio: per image, zero this fraction of the lowest fused attention
    entries (never a prefix token's column) before rolling out. Values are not rescaled for
    display. The readout row is the one the head reads: the class token's (with a distillation
    token, the mean of both rows); for global_pool="avg" the mean of the patch tokens' rows;
    for global_pool="map" the attention pool's (heads fused the same way) times the rollout.
    include_registers=False leaves register tokens out of every block's attention (rows
    renormalised), as if the model had none.
    """
    prep = _prepare(model, images, record_attention(model, images), include_registers)
    matrix = rollout_matrix(prep.attentions, head_fusion, discard_ratio, prep.num_prefix_tokens)
    pool_row = None
    if prep.pool_attention is not None:
        # (B, nh, L, N) -> (B, N): heads fused, latents averaged (SigLIP has one), sum one
        pool_row = _normalized(fuse_heads(prep.pool_attention, head_fusion).mean(dim=1))
    return patch_map(matrix, prep.grid_size, prep.num_prefix_tokens, _readout(prep, pool_row))


def _explained(
    model: nn.Module,
    images: torch.Tensor,
    *,
    target: Target,
    direction: torch.Tensor | None,
    similarity: Similarity,
    pre_logits: bool,
    include_registers: bool,
) -> _Prepared:
    """The attention and its gradients of the class or the direction the gradient methods
    explain, prepared for a map (`_prepare`)."""
    record = record_attention(
        model,
        images,
        True,
        target,
        direction=direction,
        similarity=similarity,
        pre_logits=pre_logits,
    )
    return _prepare(model, images, record, include_registers)


def gradient_rollout(
    model: nn.Module,
    images: torch.Tensor,
    target: Target = None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    *,
    direction: torch.Tensor | None = None,
    similarity: Similarity = "cosine",
    pre_logits: bool = True,
    include_registers: bool = True,
) -> torch.Tensor:
    """Gradient-weighted attention rollout for a class or a direction: (B, gh, gw).

    target: None for each image's predicted class, an int or a class name (one of
    `model.class_names`) for one class for all, or B ints or names.
    direction: instead of a class, an embedding ((D,) or (B, D)) whose `similarity` ("cosine"
    or "dot") to each image's pooled embedding is explained (headless backbones); with
    `pre_logits=False`, to the head's output (a CLIP text embedding and the image projection,
    see `vit.explain.capture.embed`). Other arguments as in `attention_rollout`; the attention
    pool's row is grad * attention fused, clamped at zero and normalised like a rollout row.
    """
    prep = _explained(
        model,
        images,
        target=target,
        direction=direction,
        similarity=similarity,
        pre_logits=pre_logits,
        include_registers=include_registers,
    )
    matrix = gradient_rollout_matrix(
        prep.attentions, prep.gradients, head_fusion, discard_ratio, prep.num_prefix_tokens
    )
    pool_row = None
    if prep.pool_attention is not None:
        weighted = fuse_heads(prep.pool_attention * prep.pool_gradient, head_fusion).clamp(min=0)
        pool_row = _normalized(weighted.mean(dim=1))  # (B, N)
    return patch_map(matrix, prep.grid_size, prep.num_prefix_tokens, _readout(prep, pool_row))


def relevance(
    model: nn.Module,
    images: torch.Tensor,
    target: Target = None,
    *,
    direction: torch.Tensor | None = None,
    similarity: Similarity = "cosine",
    pre_logits: bool = True,
    include_registers: bool = True,
) -> torch.Tensor:
    """Chefer et al. 2021 gradient-times-attention relevance for a class: (B, gh, gw).

    target, direction, similarity, pre_logits, include_registers: as in `gradient_rollout`. With an
    attention pool its mean_h((grad * A)^+) row reads the relevance matrix (the pool's latent
    query is not a token, so it has no identity term).
    """
    prep = _explained(
        model,
        images,
        target=target,
        direction=direction,
        similarity=similarity,
        pre_logits=pre_logits,
        include_registers=include_registers,
    )
    matrix = relevance_matrix(prep.attentions, prep.gradients)
    pool_row = None
    if prep.pool_attention is not None:
        pool_row = (prep.pool_attention * prep.pool_gradient).clamp(min=0).mean(dim=(1, 2))
    return patch_map(matrix, prep.grid_size, prep.num_prefix_tokens, _readout(prep, pool_row))


def last_block_attention(
    model: nn.Module, images: torch.Tensor, *, include_registers: bool = True
) -> torch.Tensor:
    """The DINO picture: the last block's attention from the readout to the patches, one map
    per head, raw probabilities: (B, nh, gh, gw).

    For a class-token model this is each head's class-token row over the patches (Caron et al.
    2021, Fig. 1); with a distillation token the mean of both rows; for global_pool="avg" the
    mean of the patch tokens' rows; for global_pool="map" the attention pool's weights (heads
    averaged) times each head's rows. include_registers=False renormalises each row over the
    tokens that are not registers first.
    """
    prep = _prepare(model, images, record_attention(model, images), include_registers)
    last = prep.attentions[-1]  # (B, nh, N, N)
    pool_row = None
    if prep.pool_attention is not None:
        pool_row = _normalized(prep.pool_attention.mean(dim=(1, 2)))  # (B, N)
    readout = _readout(prep, pool_row)
    if isinstance(readout, str):  # "avg": every patch token's row, equally
        batch, n = last.shape[0], last.shape[-1]
        readout = torch.zeros(batch, n, dtype=last.dtype, device=last.device)
        readout[:, prep.num_prefix_tokens :] = 1 / (n - prep.num_prefix_tokens)
    rows = torch.einsum("bn,bhnm->bhm", readout.expand(last.shape[0], -1), last)  # (B, nh, N)
    gh, gw = prep.grid_size
    return rows[:, :, prep.num_prefix_tokens :].reshape(*rows.shape[:2], gh, gw)


# -- attention distance ------------------------------------------------------------------------
def mean_attention_distance(
    attentions: Sequence[torch.Tensor],
    grid_size: tuple[int, int],
    patch_size: tuple[int, int],
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Mean attention distance in pixels per block and head, (depth, nh), as in the ViT paper.

    For each query patch, the distance from its centre to every key patch's centre weighted by
    the attention between them, averaged over query patches and images. Prefix tokens have no
    position, so their rows and columns are left out and each query's attention over the
    patches is renormalised to sum to one (otherwise attention parked on the class token would
    count as distance zero). attentions: depth tensors (B, nh, N, N).
    """
    gh, gw = grid_size
    ph, pw = patch_size
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([rows.flatten() * ph, cols.flatten() * pw], dim=1).double()
    distances = torch.cdist(centres, centres)  # (gh*gw, gh*gw) pixels between patch centres
    result = []
    for a in attentions:
        patches = a[:, :, num_prefix_tokens:, num_prefix_tokens:].double()  # (B, nh, gh*gw, gh*gw)
        patches = patches / patches.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        per_query = (patches * distances.to(patches.device)).sum(dim=-1)  # (B, nh, gh*gw)
        result.append(per_query.mean(dim=(0, 2)))  # (nh,)
    return torch.stack(result).float()


def model_attention_distance(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """`mean_attention_distance` of `model` on `images` (B, C, H, W): (depth, nh) pixels."""
    record = record_attention(model, images)
    return mean_attention_distance(
        record.attentions,
        grid_of(model, images),
        model.patch_embed.patch_size,
        model.num_prefix_tokens,
    )


METHODS: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "attention rollout": attention_rollout,
    "gradient rollout": gradient_rollout,
    "relevance (Chefer et al.)": relevance,
}
"""The model-level maps by display name, each (model, images) -> (B, gh, gw)."""
