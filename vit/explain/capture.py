"""Running a model with its attention recorded: every block's softmax probabilities and an
attention-pool readout's, with their gradients for a class logit or a similarity if asked.

`capture_attention` records during the forwards of a `with` block. `record_attention` runs one
forward pass (plus one backward for gradients) in eval mode with the explicit attention path
switched on, whatever the model was using before, and restores both settings afterwards. A
headless backbone has no class to explain: the gradients are then of the cosine (or
dot-product) similarity of each image's pooled embedding (`embed`) to a `direction` in
embedding space (another image's `embed`), or with `pre_logits=False` in the space of the
head's output (a CLIP model's image projection: a CLIP text embedding).

Shape legend: B batch, nh heads, N tokens (prefix + patches), gh*gw patches, L the attention
pool's latent queries (one), D embedding width.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Target = int | str | Sequence[int] | Sequence[str] | torch.Tensor | None  # str: a class name
Similarity = Literal["cosine", "dot"]


def _pool_module(model: nn.Module) -> nn.Module | None:
    """The attention-pool readout (global_pool="map", SigLIP), or None."""
    return getattr(model, "attn_pool", None)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every self-attention module of the model, in forward (depth) order (not the pool's)."""
    from ..models.vision_transformer import Attention

    pool = _pool_module(model)
    in_pool = {id(m) for m in pool.modules()} if pool is not None else set()
    modules = [m for m in model.modules() if isinstance(m, Attention) and id(m) not in in_pool]
    if not modules:
        raise ValueError(
            f"{type(model).__name__} has no vit.models.vision_transformer.Attention modules to "
            "capture"
        )
    return modules


@dataclass
class _Captured:
    blocks: list[torch.Tensor]  # depth tensors (B, nh, N, N)
    pool: list[torch.Tensor]  # the attention pool's (B, nh, L, gh*gw): it reads patches only


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
    pool_gradient: the attention-pool readout's (B, nh, L, gh*gw) probabilities (over the patch
    tokens alone: the pool reads no prefix token) and their gradient
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
            f"{tuple(embeddings.shape)}: pass one ({embeddings.shape[-1]},) vector or one per "
            f"image (pre_logits=False takes one in the space of the model's head output, where a "
            f"CLIP model's text embeddings live)"
        )
    if similarity == "cosine":
        return F.cosine_similarity(embeddings, direction, dim=-1)
    if similarity == "dot":
        return (embeddings * direction).sum(dim=-1)
    raise ValueError(f"similarity must be 'cosine' or 'dot', got {similarity!r}")


@torch.no_grad()
def embed(model: nn.Module, images: torch.Tensor, pre_logits: bool = True) -> torch.Tensor:
    """The embeddings of `images` in eval mode, the space `direction` lives in: the pooled
    features before the head (B, D), what a headless backbone (DINOv2, CLIP's image tower)
    returns, or with `pre_logits=False` the head's output (B, K): a CLIP model's image
    projection into its text space, where its text embeddings live."""
    with _eval_mode(model):
        return model.forward_head(model.forward_features(images), pre_logits=pre_logits)


def record_attention(
    model: nn.Module,
    images: torch.Tensor,
    with_gradients: bool = False,
    target: Target = None,
    *,
    direction: torch.Tensor | None = None,
    similarity: Similarity = "cosine",
    pre_logits: bool = True,
) -> AttentionRecord:
    """Run `model` on `images` (B, C, H, W) in eval mode and capture its attention.

    With `with_gradients`, also backpropagate each image's `target` logit (None: the predicted
    class; an int or a name in `model.class_names`: that class for every image; a sequence or
    tensor of B ints, or B names: one per image) and
    return the gradients with respect to each block's attention, paired with that same block.
    With `direction` ((D,) or (B, D), e.g. another image's `embed`) the gradients are of the
    similarity between each image's pooled embedding and the direction instead (see
    `similarity_scores`): the way to explain a headless backbone. With `pre_logits=False` the
    embedding is the head's output instead ((K,) or (B, K)): a CLIP model's image projection,
    to explain the similarity to a CLIP text embedding. Summing the scores over
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
                targets = _resolve_target(class_indices(model, target), logits)
                scores = logits.gather(1, targets[:, None])[:, 0]
            else:
                features = model.forward_features(x)
                embeddings = model.forward_head(features, pre_logits=pre_logits)
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


def class_indices(model: nn.Module, target: Target) -> Target:
    """`target` with class names ("cat", or B names) read as their indices in
    `model.class_names`; any other target as it is."""
    names = [target] if isinstance(target, str) else target
    if not (isinstance(names, Sequence) and names and all(isinstance(n, str) for n in names)):
        return target
    known = list(getattr(model, "class_names", None) or ())
    if not known:
        raise ValueError(
            f"target {target!r}: the model has no class names (model.class_names); give the "
            f"class index instead"
        )
    unknown = [name for name in names if name not in known]
    if unknown:
        shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
        raise ValueError(f"target {unknown[0]!r} is not one of the model's classes: {shown}")
    indices = [known.index(name) for name in names]
    return indices[0] if isinstance(target, str) else indices


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
