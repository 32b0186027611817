"""What a ViT looks at: attention capture, rollout, gradient rollout, relevance, faithfulness.

Three maps of "which patches mattered", all of shape (B, gh, gw) and all batched:

* `attention_rollout` (Abnar & Zuidema 2020): add the identity for the residual connection,
  renormalise the rows, multiply the layers together, read the classifier token's row.
* `gradient_rollout` (jacobgil's vit-explain): the same recipe on attention weighted by the
  gradient of a class logit, negative contributions clamped away, so the map is class-specific.
* `relevance` (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability"):
  R = I, then R += mean_h((grad * A)^+) @ R block by block; the map is R's readout row.

The model-level functions run one forward pass (plus one backward for the gradient methods)
in eval mode with the explicit attention path switched on, whatever the model was using
before, and restore both settings afterwards. The matrix-level functions (`rollout_matrix`,
`gradient_rollout_matrix`, `relevance_matrix`, `patch_map`) take captured tensors and work for
any number of prefix tokens and any grid, which is what the tests exercise directly.

`perturbation_curve` / `faithfulness` measure whether a map is right: delete the patches it
ranks highest (positive perturbation, accuracy should collapse fast, lower area is better) or
lowest (negative perturbation, accuracy should hold, higher area is better).

Shape legend: B batch, nh heads, N tokens (prefix + gh*gw), P prefix tokens, gh/gw grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

HeadFusion = Literal["mean", "max", "min"]
Target = int | Sequence[int] | torch.Tensor | None


# -- capture -----------------------------------------------------------------------------------
def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every self-attention module of the model, in forward (depth) order."""
    from .model import Attention

    modules = [m for m in model.modules() if isinstance(m, Attention)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no vit.model.Attention modules to capture")
    return modules


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record every block's attention probabilities during forwards inside the `with`.

    Yields a list that each forward appends to, block by block in depth order: tensors of shape
    (B, nh, N, N) whose rows sum to one, still in the autograd graph (so gradients with respect
    to them can be taken). For the duration every attention module takes its explicit softmax
    path, because the fused kernel never materialises the probabilities; the logits are the
    same either way. The previous fused settings are restored and the hooks removed on exit,
    also when the body raises.

        with capture_attention(model) as attentions:
            logits = model(images)
        # attentions: list of depth tensors (B, nh, N, N)
    """
    modules = _attention_modules(model)
    previous = [m.fused_attn for m in modules]
    attentions: list[torch.Tensor] = []
    # Hook the softmax module itself, not attn_drop: the probabilities always pass through it on
    # the explicit path, and dropout is not where the attention is defined.
    hooks = [
        m.softmax.register_forward_hook(lambda _mod, _inp, out: attentions.append(out))
        for m in modules
    ]
    try:
        for m in modules:
            m.fused_attn = False
        yield attentions
    finally:
        for hook in hooks:
            hook.remove()
        for m, fused in zip(modules, previous, strict=True):
            m.fused_attn = fused


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

    logits: (B, num_classes). attentions: depth tensors (B, nh, N, N), detached.
    gradients: depth tensors (B, nh, N, N), d(target logit)/d(attention), or None when no
    backward was run. targets: (B,) class indices the gradients are for, or None.
    """

    logits: torch.Tensor
    attentions: list[torch.Tensor]
    gradients: list[torch.Tensor] | None = None
    targets: torch.Tensor | None = None


def record_attention(
    model: nn.Module, images: torch.Tensor, with_gradients: bool = False, target: Target = None
) -> AttentionRecord:
    """Run `model` on `images` (B, C, H, W) in eval mode and capture its attention.

    With `with_gradients`, also backpropagate each image's `target` logit (None: the predicted
    class; an int: that class for every image; a sequence/tensor of B ints: one per image) and
    return the gradients with respect to each block's attention, paired with that same block.
    Summing the selected logits over the batch gives per-image gradients, because images do
    not interact in a ViT in eval mode. Parameter `.grad`s are left untouched.
    """
    with _eval_mode(model), capture_attention(model) as attentions:
        if not with_gradients:
            with torch.no_grad():
                logits = model(images)
            return AttentionRecord(logits, [a.detach() for a in attentions])
        # The input requires grad so the attention is in the graph even for frozen weights.
        with torch.enable_grad():
            logits = model(images.detach().requires_grad_(True))
            targets = _resolve_target(target, logits)
            selected = logits.gather(1, targets[:, None]).sum()
            # autograd.grad with the captured tensors as inputs: gradient i belongs to block i by
            # construction (backward hooks fire in reverse order, a classic source of mix-ups).
            gradients = torch.autograd.grad(selected, attentions)
    return AttentionRecord(
        logits.detach(),
        [a.detach() for a in attentions],
        [g.detach() for g in gradients],
        targets,
    )


def _resolve_target(target: Target, logits: torch.Tensor) -> torch.Tensor:
    """Class indices (B,) from None (predicted), an int, or B ints."""
    batch, num_classes = logits.shape
    if target is None:
        targets = logits.argmax(dim=1)
    elif isinstance(target, int):
        targets = torch.full((batch,), target, dtype=torch.long, device=logits.device)
    else:
        targets = torch.as_tensor(target, dtype=torch.long, device=logits.device).reshape(-1)
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
    readout: Literal["token", "avg"] = "token",
) -> torch.Tensor:
    """The classifier's view of a (B, N, N) token-to-token matrix, as a (B, gh, gw) map.

    readout "token": the row of token 0 (the class token the head reads). "avg": the mean of
    the patch tokens' rows, because a global-average-pooled head reads all patch tokens
    equally (models without a class token). Prefix-token columns are dropped; the remaining
    gh*gw columns are the patches in row-major order. No rescaling: these are raw values.
    """
    gh, gw = grid_size
    batch, n, _ = matrix.shape
    if n != num_prefix_tokens + gh * gw:
        raise ValueError(
            f"{n} tokens do not match {num_prefix_tokens} prefix tokens + a {gh}x{gw} grid"
        )
    if readout == "token":
        if num_prefix_tokens == 0:
            raise ValueError("readout='token' needs a prefix (class) token; use readout='avg'")
        row = matrix[:, 0]  # (B, N)
    elif readout == "avg":
        row = matrix[:, num_prefix_tokens:].mean(dim=1)  # (B, N)
    else:
        raise ValueError(f"readout must be 'token' or 'avg', got {readout!r}")
    return row[:, num_prefix_tokens:].reshape(batch, gh, gw)


# -- model-level maps --------------------------------------------------------------------------
def _to_map(model: nn.Module, matrix: torch.Tensor) -> torch.Tensor:
    readout = "avg" if getattr(model, "global_pool", "token") == "avg" else "token"
    return patch_map(matrix, model.grid_size, model.num_prefix_tokens, readout)


def attention_rollout(
    model: nn.Module,
    images: torch.Tensor,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Raw attention rollout of the classifier token to every patch: (B, gh, gw).

    images: (B, C, H, W), normalised as the model expects. head_fusion: how each layer's heads
    are combined. discard_ratio: per image, zero this fraction of the lowest fused attention
    entries (never a prefix token's column) before rolling out. Values are not rescaled for
    display. For a model without a class token (global_pool="avg") the map is the mean of the
    patch tokens' rows, the tokens its head averages.
    """
    record = record_attention(model, images)
    matrix = rollout_matrix(record.attentions, head_fusion, discard_ratio, model.num_prefix_tokens)
    return _to_map(model, matrix)


def gradient_rollout(
    model: nn.Module,
    images: torch.Tensor,
    target: Target = None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Gradient-weighted attention rollout for a class: (B, gh, gw).

    target: None for each image's predicted class, an int for one class for all, or B ints.
    Other arguments as in `attention_rollout`.
    """
    record = record_attention(model, images, with_gradients=True, target=target)
    matrix = gradient_rollout_matrix(
        record.attentions, record.gradients, head_fusion, discard_ratio, model.num_prefix_tokens
    )
    return _to_map(model, matrix)


def relevance(model: nn.Module, images: torch.Tensor, target: Target = None) -> torch.Tensor:
    """Chefer et al. 2021 gradient-times-attention relevance for a class: (B, gh, gw).

    target: None for each image's predicted class, an int for one class for all, or B ints.
    """
    record = record_attention(model, images, with_gradients=True, target=target)
    return _to_map(model, relevance_matrix(record.attentions, record.gradients))


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
        record.attentions, model.grid_size, model.patch_embed.patch_size, model.num_prefix_tokens
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
