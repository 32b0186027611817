"""Faithfulness: whether a map is right, measured by perturbation. Delete the patches it ranks
highest (positive perturbation: accuracy should collapse fast, lower area is better) or lowest
(negative perturbation: accuracy should hold, higher area is better), and take the area under
the accuracy curve. `random_map` is the baseline any method must beat.

Shape legend: B batch, C channels, H/W pixels, gh/gw patch grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .capture import _eval_mode

DEFAULT_FRACTIONS = tuple(i / 10 for i in range(11))  # 0%, 10%, ..., 100% of patches removed


def remove_patches(
    images: torch.Tensor,
    relevance_map: torch.Tensor,
    fraction: float,
    most_relevant: bool,
    patch_size: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Blank the `fraction` most (or least) relevant patches of each image.

    images: (B, C, H, W), normalised. relevance_map: (B, gh, gw). Blanked patches are set to 0
    in normalised space, i.e. to the dataset's mean colour: the "no information" value the
    model saw least surprise from in training, and the same replacement for every method.
    patch_size: (ph, pw) pixels, where the patches leave a margin (a size they do not divide);
    None: (H / gh, W / gw). Returns a new (B, C, H, W) tensor.
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
    # Expand each grid cell to its patch's pixels; a margin the patches leave (a size they do
    # not divide) is seen by no patch, and kept as it is.
    ph, pw = patch_size or (height // gh, width // gw)
    keep = keep.repeat_interleave(ph, dim=2).repeat_interleave(pw, dim=3)
    keep = F.pad(keep, (0, width - keep.shape[-1], 0, height - keep.shape[-2]), value=1.0)
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
    patch_size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    with _eval_mode(model):
        accuracies = []
        for fraction in fractions:
            perturbed = remove_patches(
                images, relevance_map, fraction, most_relevant=positive, patch_size=patch_size
            )
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
