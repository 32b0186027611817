"""Test-time augmentation: score an image and its mirror image together.

A horizontally flipped CIFAR or ImageNet photograph is as likely as the original, so the mean
of the two softmax distributions is a better estimate than either alone (typically +0.5 to 1
point of top-1 for a small ViT, at twice the inference cost).
"""

from __future__ import annotations

import math

import torch
from torch import nn

TTA_CHOICES = ("none", "flip")


@torch.no_grad()
def flip_tta(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (B, C, H, W) -> (plain logits (B, K), flip-TTA log-probabilities (B, K)).

    The second is log((softmax(f(x)) + softmax(f(flip(x)))) / 2): usable as logits (its
    softmax is the mean probability, its argmax the TTA prediction, its NLL the TTA loss).
    """
    logits = model(images).float()  # (B, K)
    mirrored = model(images.flip(-1)).float()  # (B, K)
    log_probs = torch.stack([logits.log_softmax(-1), mirrored.log_softmax(-1)])  # (2, B, K)
    return logits, log_probs.logsumexp(0) - math.log(2)
