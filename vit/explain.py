"""What a ViT looks at: attention capture, rollout, gradient rollout, relevance, faithfulness.

Three maps of "which patches mattered", all of shape (B, gh, gw) and all batched, for every
family the model expresses (class token or none, registers, a distillation token, average or
attention-pool readout), plus the DINO picture, `last_block_attention`, one map per head:

* `attention_rollout` (Abnar & Zuidema 2020): add the identity for the residual connection,
  renormalise the rows, multiply the layers together, read the classifier token's row.
* `gradient_rollout` (jacobgil's vit-explain): the same recipe on attention weighted by the
  gradient of a class logit, negative contributions clamped away, so the map is class-specific.
* `relevance` (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability"):
  R = I, then R += mean_h((grad * A)^+) @ R block by block; the map is R's readout row.

The map is read where the head reads: the class token's row (with a distillation token, the
mean of both rows), the mean of the patch rows for global_pool="avg", or the attention pool's
weights over the tokens for global_pool="map". Register tokens can be left out
(`include_registers=False`). A headless backbone has no class to explain: the gradient methods
then take a `direction` in embedding space (another image's or a text's embedding) and explain
the cosine (or dot-product) similarity of each image's pooled embedding to it.

The model-level functions run one forward pass (plus one backward for the gradient methods)
in eval mode with the explicit attention path switched on, whatever the model was using
before, and restore both settings afterwards. The matrix-level functions (`rollout_matrix`,
`gradient_rollout_matrix`, `relevance_matrix`, `patch_map`) take captured tensors and work for
any number of prefix tokens and any grid, which is what the tests exercise directly.

`perturbation_curve` / `faithfulness` measure whether a map is right: delete the patches it
ranks highest (positive perturbation, accuracy should collapse fast, lower area is better) or
lowest (negative perturbation, accuracy should hold, higher area is better).

Shape legend: B batch, nh heads, N tokens (prefix + gh*gw), P prefix tokens (class,
distillation, registers), gh/gw grid, L the attention pool's latent queries, D embedding width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

HeadFusion = Literal["mean", "max", "min"]
Target = int | Sequence[int] | torch.Tensor | None
Similarity = Literal["cosine", "dot"]


# -- what the model reads out ------------------------------------------------------------------
def num_registers(model: nn.Module) -> int:
    """How many register tokens (DINOv2 with registers) the model has: the last prefix tokens."""
    count = getattr(model, "num_reg_tokens", None)  # timm's attribute name
    if count is None:
        count = getattr(getattr(model, "config", None), "reg_tokens", 0)
    return int(count or 0)


def readout_tokens(model: nn.Module) -> list[int]:
    """The token rows a class-token head reads: the class token (0), and for a distilled model
    (DeiT) the distillation token (1) too, because its two heads' outputs are averaged."""
    distilled = getattr(model, "dist_token", None) is not None or bool(
        getattr(getattr(model, "config", None), "distilled", False)
    )
    return [0, 1] if distilled else [0]


def grid_of(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """The patch grid (gh, gw) of `images` (B, C, H, W): the model's own, or another size's
    when the model resamples its position embeddings (dynamic_img_size)."""
    ph, pw = model.patch_embed.patch_size
    return images.shape[-2] // ph, images.shape[-1] // pw


# -- capture -----------------------------------------------------------------------------------
def _pool_module(model: nn.Module) -> nn.Module | None:
    """The attention-pool readout (global_pool="map", SigLIP), or None."""
    return getattr(model, "attn_pool", None)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every self-attention module of the model, in forward (depth) order (not the pool's)."""
    from .model import Attention

    pool = _pool_module(model)
    in_pool = {id(m) for m in pool.modules()} if pool is not None else set()
    modules = [m for m in model.modules() if isinstance(m, Attention) and id(m) not in in_pool]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no vit.model.Attention modules to capture")
    return modules


@dataclass
class _Captured:
    blocks: list[torch.Tensor]  # depth tensors (B, nh, N, N)
    pool: list[torch.Tensor]  # the attention pool's (B, nh, L, N), L latent queries


@contextmanager
def _capture(model: nn.Module) -> Iterator[_Captured]:
    """Hooks on every softmax (blocks and attention pool), explicit paths switched on."""
    blocks = _attention_modules(model)
    pool = _pool_module(model)
    if pool is not None and not isinstance(getattr(pool, "softmax", None), nn.Module):
        raise ValueError(
            f"{type(pool).__name__} (the attention pool) has no `softmax` module to observe"
        )
    switched = blocks + ([pool] if pool is not None else [])
    previous = [m.fused_attn for m in switched]
    captured = _Captured([], [])
    # Hook the softmax module itself, not attn_drop: the probabilities always pass through it on
    # the explicit path, and dropout is not where the attention is defined.
    hooks = [
        m.softmax.register_forward_hook(lambda _mod, _inp, out: captured.blocks.append(out))
        for m in blocks
    ]
    if pool is not None:
        hooks.append(
            pool.softmax.register_forward_hook(lambda _mod, _inp, out: captured.pool.append(out))
        )
    try:
        for m in switched:
            m.fused_attn = False
        yield captured
    finally:
        for hook in hooks:
            hook.remove()
        for m, fused in zip(switched, previous, strict=True):
            m.fused_attn = fused


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record every block's attention probabilities during forwards inside the `with`.

    Yields a list that each forward appends to, block by block in depth order: tensors of shape
    (B, nh, N, N) whose rows sum to one, still in the autograd graph (so gradients with respect
    to them can be taken). For the duration every attention module (an attention-pool readout
    included) takes its explicit softmax path, because the fused kernel never materialises the
    probabilities; the logits are the same either way. The previous fused settings are restored
    and the hooks removed on exit, also when the body raises. `record_attention` also returns
    the attention pool's probabilities.

        with capture_attention(model) as attentions:
            logits = model(images)
        # attentions: list of depth tensors (B, nh, N, N)
    """
    with _capture(model) as captured:
        yield captured.blocks


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Explanations are of the deterministic model: no dropout or stochastic depth."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@dataclass
class AttentionRecord:
    """One explained forward pass.

    logits: (B, num_classes), the model's output (for a headless model its pooled embedding);
    None when a direction was explained. attentions: depth tensors (B, nh, N, N), detached.
    gradients: depth tensors (B, nh, N, N), d(score)/d(attention), or None when no backward was
    run. targets: (B,) class indices the gradients are for, or None. pool_attention /
    pool_gradient: the attention-pool readout's (B, nh, L, N) probabilities and their gradient
    (global_pool="map"), else None. embeddings: (B, D) pooled features when a direction was
    explained. scores: (B,) the explained quantity (target logit or similarity).
    """

    logits: torch.Tensor | None
    attentions: list[torch.Tensor]
    gradients: list[torch.Tensor] | None = None
    targets: torch.Tensor | None = None
    pool_attention: torch.Tensor | None = None
    pool_gradient: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    scores: torch.Tensor | None = None


def similarity_scores(
    embeddings: torch.Tensor, direction: torch.Tensor, similarity: Similarity = "cosine"
) -> torch.Tensor:
    """Each embedding's similarity to `direction`: (B, D) and (D,) or (B, D) -> (B,).

    "cosine": cos(embedding, direction), what retrieval with DINOv2 or CLIP ranks by (scale
    free: the map shows what makes the two point the same way). "dot": embedding . direction;
    with a classifier's weight row as the direction this is that class's logit minus its bias,
    so the explanation equals the class explanation.
    """
    # detached: a text tower's graph behind the direction is not part of the explanation
    direction = torch.as_tensor(direction, dtype=embeddings.dtype, device=embeddings.device)
    direction = direction.detach()
    if direction.ndim == 1 and direction.shape == embeddings.shape[1:]:
        direction = direction.expand_as(embeddings)  # one direction for every image
    if direction.shape != embeddings.shape:
        raise ValueError(
            f"direction has shape {tuple(direction.shape)}; the model's embeddings are "
            f"{tuple(embeddings.shape)}: pass one ({embeddings.shape[-1]},) vector or one per image"
        )
    if similarity == "cosine":
        return F.cosine_similarity(embeddings, direction, dim=-1)
    if similarity == "dot":
        return (embeddings * direction).sum(dim=-1)
    raise ValueError(f"similarity must be 'cosine' or 'dot', got {similarity!r}")


@torch.no_grad()
def embed(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Pooled pre-logits features (B, D) of `images` in eval mode: the embedding a headless
    backbone (DINOv2, CLIP's image tower) returns, and the space `direction` lives in."""
    with _eval_mode(model):
        return model.forward_head(model.forward_features(images), pre_logits=True)


def record_attention(
    model: nn.Module,
    images: torch.Tensor,
    with_gradients: bool = False,
    target: Target = None,
    *,
    direction: torch.Tensor | None = None,
    similarity: Similarity = "cosine",
) -> AttentionRecord:
    """Run `model` on `images` (B, C, H, W) in eval mode and capture its attention.

    With `with_gradients`, also backpropagate each image's `target` logit (None: the predicted
    class; an int: that class for every image; a sequence/tensor of B ints: one per image) and
    return the gradients with respect to each block's attention, paired with that same block.
    With `direction` ((D,) or (B, D), e.g. another image's or a text's embedding) the gradients
    are of the similarity between each image's pooled embedding and the direction instead
    (see `similarity_scores`): the way to explain a headless backbone. Summing the scores over
    the batch gives per-image gradients, because images do not interact in a ViT in eval mode.
    Parameter `.grad`s are left untouched.
    """
    if direction is not None and target is not None:
        raise ValueError("pass either a class target or a direction, not both")
    with_gradients = with_gradients or direction is not None
    with _eval_mode(model), _capture(model) as captured:
        if not with_gradients:
            with torch.no_grad():
                logits = model(images)
            return AttentionRecord(
                logits, [a.detach() for a in captured.blocks], pool_attention=_pool(captured)
            )
        # The input requires grad so the attention is in the graph even for frozen weights.
        with torch.enable_grad():
            x = images.detach().requires_grad_(True)
            logits = targets = embeddings = None
            if direction is None:
                if getattr(model, "num_classes", 1) == 0:
                    raise ValueError(
                        "the model has no classifier head (num_classes=0): there is no class to "
                        "explain; pass direction= (an embedding to explain the similarity to)"
                    )
                logits = model(x)
                targets = _resolve_target(target, logits)
                scores = logits.gather(1, targets[:, None])[:, 0]
            else:
                embeddings = model.forward_head(model.forward_features(x), pre_logits=True)
                scores = similarity_scores(embeddings, direction, similarity)
            # autograd.grad with the captured tensors as inputs: gradient i belongs to block i by
            # construction (backward hooks fire in reverse order, a classic source of mix-ups).
            gradients = torch.autograd.grad(scores.sum(), captured.blocks + captured.pool)
    depth = len(captured.blocks)
    return AttentionRecord(
        None if logits is None else logits.detach(),
        [a.detach() for a in captured.blocks],
        [g.detach() for g in gradients[:depth]],
        targets,
        pool_attention=_pool(captured),
        pool_gradient=gradients[depth].detach() if captured.pool else None,
        embeddings=None if embeddings is None else embeddings.detach(),
        scores=scores.detach(),
    )


def _pool(captured: _Captured) -> torch.Tensor | None:
    if len(captured.pool) > 1:
        raise RuntimeError(f"the attention pool ran {len(captured.pool)} times in one forward")
    return captured.pool[0].detach() if captured.pool else None


def _resolve_target(target: Target, logits: torch.Tensor) -> torch.Tensor:
    """Class indices (B,) from None (predicted), an int, or B ints."""
    batch, num_classes = logits.shape
    if target is None:
        targets = logits.argmax(dim=1)
    elif isinstance(target, int):
        targets = torch.full((batch,), target, dtype=torch.long, device=logits.device)
    else:
        targets = torch.as_tensor(target, device=logits.device)
        if targets.is_floating_point():
            raise ValueError("target must be class indices (ints); an embedding goes in direction=")
        targets = targets.long().reshape(-1)
        if targets.numel() != batch:
            raise ValueError(f"target has {targets.numel()} entries for a batch of {batch} images")
    if ((targets < 0) | (targets >= num_classes)).any():
        raise ValueError(f"target {target!r} out of range for {num_classes} classes")
    return targets


# -- matrix-level recipes ----------------------------------------------------------------------
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


# -- model-level maps --------------------------------------------------------------------------
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
    global_pool = getattr(model, "global_pool", "token")
    if global_pool not in ("token", "avg", "map"):
        raise ValueError(
            f"global_pool={global_pool!r}: the model does not pool its tokens into one readout "
            "to explain; explanations need global_pool 'token', 'avg' or 'map'"
        )
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


def gradient_rollout(
    model: nn.Module,
    images: torch.Tensor,
    target: Target = None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    *,
    direction: torch.Tensor | None = None,
    similarity: Similarity = "cosine",
    include_registers: bool = True,
) -> torch.Tensor:
    """Gradient-weighted attention rollout for a class or a direction: (B, gh, gw).

    target: None for each image's predicted class, an int for one class for all, or B ints.
    direction: instead of a class, an embedding ((D,) or (B, D)) whose `similarity` ("cosine"
    or "dot") to each image's pooled embedding is explained (headless backbones). Other
    arguments as in `attention_rollout`; the attention pool's row is grad * attention fused,
    clamped at zero and normalised like a rollout row.
    """
    record = record_attention(
        model, images, True, target, direction=direction, similarity=similarity
    )
    prep = _prepare(model, images, record, include_registers)
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
    include_registers: bool = True,
) -> torch.Tensor:
    """Chefer et al. 2021 gradient-times-attention relevance for a class: (B, gh, gw).

    target, direction, similarity, include_registers: as in `gradient_rollout`. With an
    attention pool its mean_h((grad * A)^+) row reads the relevance matrix (the pool's latent
    query is not a token, so it has no identity term).
    """
    record = record_attention(
        model, images, True, target, direction=direction, similarity=similarity
    )
    prep = _prepare(model, images, record, include_registers)
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
        patches = a[:, :, num_prefix_tokens:, num_prefix_tokens:].double()  # (B, nh, P, P)
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


# -- faithfulness ------------------------------------------------------------------------------
DEFAULT_FRACTIONS = tuple(i / 10 for i in range(11))  # 0%, 10%, ..., 100% of patches removed


def remove_patches(
    images: torch.Tensor, relevance_map: torch.Tensor, fraction: float, most_relevant: bool
) -> torch.Tensor:
    """Blank the `fraction` most (or least) relevant patches of each image.

    images: (B, C, H, W), normalised. relevance_map: (B, gh, gw). Blanked patches are set to 0
    in normalised space, i.e. to the dataset's mean colour: the "no information" value the
    model saw least surprise from in training, and the same replacement for every method.
    Returns a new (B, C, H, W) tensor.
    """
    batch, _, height, width = images.shape
    gh, gw = relevance_map.shape[-2:]
    num_patches = gh * gw
    k = round(fraction * num_patches)
    if k == 0:
        return images.clone()
    scores = relevance_map.reshape(batch, num_patches)
    order = scores.argsort(dim=1, descending=most_relevant, stable=True)  # (B, gh*gw)
    keep = torch.ones(batch, num_patches, device=images.device, dtype=images.dtype)
    keep.scatter_(1, order[:, :k], 0.0)
    keep = keep.reshape(batch, 1, gh, gw)
    # Patches are (H/gh) x (W/gw) pixels: expand each grid cell to its pixels.
    keep = keep.repeat_interleave(height // gh, dim=2).repeat_interleave(width // gw, dim=3)
    return images * keep


@torch.no_grad()
def perturbation_curve(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    relevance_map: torch.Tensor,
    positive: bool,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> torch.Tensor:
    """Top-1 accuracy (len(fractions),) as patches are removed in relevance order.

    positive=True removes the most relevant patches first (a faithful map makes accuracy fall
    fast); False removes the least relevant first (accuracy should hold).
    """
    with _eval_mode(model):
        accuracies = []
        for fraction in fractions:
            perturbed = remove_patches(images, relevance_map, fraction, most_relevant=positive)
            predictions = model(perturbed).argmax(dim=1)
            accuracies.append((predictions == labels).float().mean())
    return torch.stack(accuracies)


def area_under_curve(fractions: Sequence[float], values: torch.Tensor) -> float:
    """Trapezoidal area under values(fractions), divided by the fraction range (so in [0, 1])."""
    x = torch.as_tensor(fractions, dtype=torch.float64)
    y = values.detach().to(torch.float64).cpu()
    return float(torch.trapezoid(y, x) / (x[-1] - x[0]))


@dataclass
class Faithfulness:
    """Perturbation curves of one map and their normalised areas (lower positive is better,
    higher negative is better)."""

    fractions: tuple[float, ...]
    positive_curve: torch.Tensor  # (len(fractions),) accuracy, most relevant removed first
    negative_curve: torch.Tensor  # (len(fractions),) accuracy, least relevant removed first
    positive_auc: float
    negative_auc: float


def faithfulness(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    relevance_map: torch.Tensor,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    batch_size: int = 256,
) -> Faithfulness:
    """Positive and negative perturbation curves of `relevance_map` (B, gh, gw) and their AUCs.

    images (B, C, H, W) normalised, labels (B,) true classes. Work is split into batches of
    `batch_size` images; accuracy is over all B.
    """
    fractions = tuple(float(f) for f in fractions)
    num_patches = relevance_map.shape[-2] * relevance_map.shape[-1]
    # Removing nothing or everything gives the same images whatever the order: the negative
    # curve reuses those points from the positive one instead of running the model again.
    ordered = [i for i, f in enumerate(fractions) if 0 < round(f * num_patches) < num_patches]
    curves = {}
    for positive in (True, False):
        wanted = fractions if positive else tuple(fractions[i] for i in ordered)
        correct = torch.zeros(len(wanted), dtype=torch.float64)
        for start in range(0, len(images), batch_size):
            chunk = slice(start, start + batch_size)
            accuracy = perturbation_curve(
                model, images[chunk], labels[chunk], relevance_map[chunk], positive, wanted
            )
            correct += accuracy.cpu().double() * len(images[chunk])
        curves[positive] = (correct / len(images)).float()
    negative = curves[True].clone()
    negative[ordered] = curves[False]
    curves[False] = negative
    return Faithfulness(
        fractions,
        curves[True],
        curves[False],
        area_under_curve(fractions, curves[True]),
        area_under_curve(fractions, curves[False]),
    )


def random_map(images: torch.Tensor, grid_size: tuple[int, int], seed: int = 0) -> torch.Tensor:
    """A baseline map of uniform noise (B, gh, gw): what any method must beat."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((images.shape[0], *grid_size), generator=generator).to(images.device)


METHODS: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "attention rollout": attention_rollout,
    "gradient rollout": gradient_rollout,
    "relevance (Chefer et al.)": relevance,
}
"""The model-level maps by display name, each (model, images) -> (B, gh, gw)."""
