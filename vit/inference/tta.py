"""Test-time augmentation: classify an image by the mean probability of a few views of it.

A view the training augmentation could have produced is as likely as the original, so the mean
of the views' softmax distributions is a better estimate than any one of them.

- "flip": the image and its mirror image (2 views; +0.2 point of top-1 on CIFAR-10).
- "shift": the image and four copies moved by 1/16 of its side (2 px at 32 px, 14 px at 224)
  left, right, up and down, the uncovered border filled with black, as the training crop's
  zero padding does (5 views; +1.6 to 1.9 points on CIFAR-10 for the CPU recipes, whose pad-4
  crop the views imitate: docs/cpu-experiments.md).
- "flip-shift": both (10 views).

Each costs as many forward passes as it has views.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .options import TTA_CHOICES


def shift(images: torch.Tensor, dy: int, dx: int, fill: torch.Tensor) -> torch.Tensor:
    """Images (B, C, H, W) moved down by `dy` and right by `dx` pixels (negative: up, left);
    the uncovered rows and columns take `fill` (C,), the value of a black pixel."""
    B, C, H, W = images.shape
    pad = max(abs(dy), abs(dx))
    border = (pad, pad, pad, pad)
    # F.pad's constant is one number for all channels; black differs per channel once normalised.
    inside = F.pad(images.new_ones(1, 1, H, W), border).bool()  # (1, 1, H + 2p, W + 2p)
    padded = torch.where(inside, F.pad(images, border), fill.to(images).view(1, C, 1, 1))
    top, left = pad - dy, pad - dx
    return padded[:, :, top : top + H, left : left + W]  # (B, C, H, W)


def views(images: torch.Tensor, method: str, fill: torch.Tensor) -> list[torch.Tensor]:
    """The views `method` scores, each (B, C, H, W); the first is `images` itself."""
    if method not in TTA_CHOICES:
        raise ValueError(f"unknown test-time augmentation {method!r}; accepted: {TTA_CHOICES}")
    out = [images]
    if method in ("shift", "flip-shift"):
        step = max(1, round(images.shape[-1] / 16))  # 2 px at 32: the recipe's pad-4 crop
        moves = ((0, -step), (0, step), (-step, 0), (step, 0))  # left, right, up, down
        out += [shift(images, dy, dx, fill) for dy, dx in moves]
    if method in ("flip", "flip-shift"):
        out += [view.flip(-1) for view in out]
    return out


@torch.no_grad()
def tta_logits(
    model: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    method: str,
    fill: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (B, C, H, W) -> (plain logits (B, K), TTA log-probabilities (B, K)).

    `fill` (C,): a black pixel after normalisation (`black_pixel`). With method "none" both
    are the plain logits.
    """
    scored = [model(view).float() for view in views(images, method, fill)]  # each (B, K)
    return scored[0], log_mean_probability(*scored) if len(scored) > 1 else scored[0]


def black_pixel(preprocess) -> torch.Tensor:
    """A black pixel after `preprocess`'s normalisation: (0 - mean) / std, shape (C,).

    No preprocess recorded (a bare model): 0, the mean pixel."""
    if preprocess is None:
        return torch.zeros(3)
    return -torch.tensor(preprocess.mean) / torch.tensor(preprocess.std)


def log_mean_probability(*logits: torch.Tensor) -> torch.Tensor:
    """Logits of the same images, each (B, K) -> log of their mean softmax probability (B, K).

    Usable as logits: its softmax is the mean probability, its argmax the TTA prediction,
    its NLL the TTA loss.
    """
    log_probs = torch.stack([x.log_softmax(-1) for x in logits])  # (T, B, K)
    return log_probs.logsumexp(0) - math.log(len(logits))
