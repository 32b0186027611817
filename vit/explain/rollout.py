"""The arithmetic of the maps on captured tensors, no model: head fusion, discarding the
weakest links, leaving tokens out, three token-to-token matrices and their readout as a map.

* `rollout_matrix` (Abnar & Zuidema 2020): add the identity for the residual connection,
  renormalise the rows, multiply the layers together.
* `gradient_rollout_matrix` (jacobgil's vit-explain): the same recipe on attention weighted by
  the gradient of a class logit, negative contributions clamped away, so it is class-specific.
* `relevance_matrix` (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability"):
  R = I, then R += mean_h((grad * A)^+) @ R block by block.
* `patch_map`: the row the head reads (a token's, the mean of the patch rows, or weights over
  the tokens) over the patches.

Every function works for any number of prefix tokens and any grid, which is what the tests
exercise directly.

Shape legend: B batch, nh heads, N tokens (prefix + gh*gw), gh/gw grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

HeadFusion = Literal["mean", "max", "min"]


def fuse_heads(attention: torch.Tensor, head_fusion: HeadFusion = "mean") -> torch.Tensor:
    """Combine heads: (B, nh, N, N) -> (B, N, N) by their mean, max or min."""
    if head_fusion == "mean":
        return attention.mean(dim=1)
    if head_fusion == "max":
        return attention.amax(dim=1)
    if head_fusion == "min":
        return attention.amin(dim=1)
    raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")


def discard_lowest(
    attention: torch.Tensor, discard_ratio: float, num_prefix_tokens: int
) -> torch.Tensor:
    """Zero the lowest `discard_ratio` of entries of each image's (N, N) attention.

    attention: (B, N, N). The choice is made per image (not from image 0 for all), and the
    prefix tokens' columns are never candidates, so the attention paid to the class token
    survives. Returns a new tensor (B, N, N).
    """
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    batch, n, _ = attention.shape
    num_candidates = n * (n - num_prefix_tokens)
    k = int(num_candidates * discard_ratio)
    if k == 0:
        return attention
    ranked = attention.clone()
    ranked[:, :, :num_prefix_tokens] = float("inf")  # never among the lowest
    lowest = ranked.reshape(batch, -1).topk(k, dim=-1, largest=False).indices  # (B, k)
    out = attention.reshape(batch, -1).clone()
    out.scatter_(1, lowest, 0.0)
    return out.reshape(batch, n, n)


def drop_tokens(
    attention: torch.Tensor, tokens: Sequence[int], renormalize: bool = True
) -> torch.Tensor:
    """Leave `tokens` out of an attention tensor (..., Nq, N): their key columns, and their
    query rows too when it is square self-attention (Nq == N).

    With `renormalize` each remaining row is divided by its new sum, so the attention once
    paid to the dropped tokens is shared out in proportion among the others (use it on
    probabilities, not on gradients). Used to leave register tokens out of a map: they hold
    global information, not image regions.
    """
    n = attention.shape[-1]
    drop = set(tokens)
    keep = torch.tensor([i for i in range(n) if i not in drop], device=attention.device)
    out = attention.index_select(-1, keep)  # (..., Nq, N - len(tokens))
    if attention.shape[-2] == n:
        out = out.index_select(-2, keep)  # (..., N', N')
    if renormalize:
        out = out / out.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(out.dtype).tiny)
    return out


def _roll_out(per_layer: Sequence[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema: (A + I) / 2 per layer, rows renormalised, layers multiplied in order.

    per_layer: depth tensors (B, N, N), non-negative. Returns (B, N, N) with rows summing to 1:
    row i is how much token i of the last layer's output draws on each input token.
    """
    result = None
    for a in per_layer:
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = (a + eye) / 2  # the residual connection carries the token itself through
        a = a / a.sum(dim=-1, keepdim=True)  # keepdim: divide each row by its own sum
        result = a if result is None else a @ result  # later layer on the left
    if result is None:
        raise ValueError("no attention layers to roll out")
    return result


def rollout_matrix(
    attentions: Sequence[torch.Tensor],
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Attention rollout over all tokens: depth tensors (B, nh, N, N) -> (B, N, N)."""
    fused = [
        discard_lowest(fuse_heads(a, head_fusion), discard_ratio, num_prefix_tokens)
        for a in attentions
    ]
    return _roll_out(fused)


def gradient_rollout_matrix(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Gradient-weighted rollout: per layer fuse heads of grad * A, clamp at 0, roll out.

    attentions, gradients: depth tensors (B, nh, N, N), paired block by block. Returns
    (B, N, N). As in vit-explain the heads are fused before clamping, so a head's negative
    evidence can cancel another's positive evidence.
    """
    _check_pairs(attentions, gradients)
    fused = [
        discard_lowest(
            fuse_heads(a * g, head_fusion).clamp(min=0), discard_ratio, num_prefix_tokens
        )
        for a, g in zip(attentions, gradients, strict=True)
    ]
    return _roll_out(fused)


def relevance_matrix(
    attentions: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Chefer et al. 2021 relevance: R = I; per block R += mean_h((grad * A)^+) @ R.

    attentions, gradients: depth tensors (B, nh, N, N), paired block by block. Returns (B, N, N);
    rows are not normalised (the paper does not), the identity keeps each token's own share.
    """
    _check_pairs(attentions, gradients)
    relevance = None
    for a, g in zip(attentions, gradients, strict=True):
        if relevance is None:
            n = a.shape[-1]
            relevance = torch.eye(n, dtype=a.dtype, device=a.device).expand(a.shape[0], n, n)
        cam = (g * a).clamp(min=0).mean(dim=1)  # (B, N, N): heads clamped first, then averaged
        relevance = relevance + cam @ relevance
    if relevance is None:
        raise ValueError("no attention layers to propagate relevance through")
    return relevance


def _check_pairs(attentions: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> None:
    if len(attentions) != len(gradients):
        raise ValueError(f"{len(attentions)} attention tensors but {len(gradients)} gradients")
    for i, (a, g) in enumerate(zip(attentions, gradients, strict=True)):
        if a.shape != g.shape:
            raise ValueError(f"block {i}: attention {tuple(a.shape)} vs gradient {tuple(g.shape)}")


def patch_map(
    matrix: torch.Tensor,
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 1,
    readout: Literal["token", "avg"] | torch.Tensor = "token",
) -> torch.Tensor:
    """The classifier's view of a (B, N, N) token-to-token matrix, as a (B, gh, gw) map.

    readout "token": the row of token 0 (the class token the head reads). "avg": the mean of
    the patch tokens' rows, because a global-average-pooled head reads all patch tokens
    equally (models without a class token). A tensor of weights (N,) or (B, N): that weighted
    sum of rows (an attention pool's attention over the tokens, or 1/2 on the class and the
    distillation token). Prefix-token columns are dropped; the remaining gh*gw columns are the
    patches in row-major order. No rescaling: these are raw values.
    """
    gh, gw = grid_size
    batch, n, _ = matrix.shape
    if n != num_prefix_tokens + gh * gw:
        raise ValueError(
            f"{n} tokens do not match {num_prefix_tokens} prefix tokens + a {gh}x{gw} grid"
        )
    if isinstance(readout, torch.Tensor):
        weights = readout.to(matrix.dtype).expand(batch, n)  # (B, N)
        row = (weights[:, None, :] @ matrix)[:, 0]  # (B, N)
    elif readout == "token":
        if num_prefix_tokens == 0:
            raise ValueError("readout='token' needs a prefix (class) token; use readout='avg'")
        row = matrix[:, 0]  # (B, N)
    elif readout == "avg":
        row = matrix[:, num_prefix_tokens:].mean(dim=1)  # (B, N)
    else:
        raise ValueError(f"readout must be 'token', 'avg' or a weight tensor, got {readout!r}")
    return row[:, num_prefix_tokens:].reshape(batch, gh, gw)
