"""MixUp and CutMix on a batch (timm's semantics), and the loss on their soft targets."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def one_hot(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """(B,) class indices -> (B, num_classes) targets, label-smoothed; each row sums to 1."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return targets.scatter_(1, labels[:, None], 1.0 - smoothing + off)


class MixupCutmix:
    """MixUp (Zhang et al. 2018) or CutMix (Yun et al. 2019) on a batch, one per batch.

    Each batch is mixed with itself reversed; the mixing weight lam ~ Beta(alpha, alpha).
    When both alphas are positive, CutMix is chosen with probability `switch_prob`.
    Uses torch's global RNG, so it is reproducible from the seed and resumable.
    Returns images (B, C, H, W) and soft targets (B, num_classes) whose rows sum to one.
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.0,
    ) -> None:
        if mixup_alpha <= 0 and cutmix_alpha <= 0:
            raise ValueError("MixupCutmix needs mixup_alpha > 0 or cutmix_alpha > 0")
        self.num_classes = num_classes
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob = prob, switch_prob
        self.label_smoothing = label_smoothing
        self.enabled = True  # False (e.g. after --mixup-off-epoch): one-hot targets, no mixing

    def _beta(self, alpha: float) -> float:
        return float(torch.distributions.Beta(alpha, alpha).sample())

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        targets = one_hot(y, self.num_classes, self.label_smoothing)  # (B, K)
        if not self.enabled or float(torch.rand(())) >= self.prob:
            return x, targets
        use_cutmix = self.cutmix_alpha > 0 and (
            self.mixup_alpha <= 0 or float(torch.rand(())) < self.switch_prob
        )
        x = x.clone()
        if use_cutmix:
            lam = self._beta(self.cutmix_alpha)
            H, W = x.shape[-2:]
            cut_h, cut_w = int(H * math.sqrt(1 - lam)), int(W * math.sqrt(1 - lam))
            cy, cx = int(torch.randint(H, ())), int(torch.randint(W, ()))
            y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, H)
            x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, W)
            x[..., y0:y1, x0:x1] = x.flip(0)[..., y0:y1, x0:x1]
            lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)  # the box was clipped: use its true area
        else:
            lam = self._beta(self.mixup_alpha)
            x = x * lam + x.flip(0) * (1 - lam)
        return x, targets * lam + targets.flip(0) * (1 - lam)


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -sum_k targets[:, k] * log_softmax(logits)[:, k]."""
    return torch.sum(-targets * F.log_softmax(logits, dim=-1), dim=-1).mean()
