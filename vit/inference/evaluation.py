"""Evaluation over a loader: top-1, top-5, per-class accuracy, the confusion matrix and the mean
loss, with test-time augmentation beside them; exact under DDP (counts summed over processes)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from ..utils import process_group
from .options import TTA_CHOICES
from .precision import autocast
from .tta import black_pixel, tta_logits


class _Tally:
    """Running confusion matrix, loss sum and top-5 hits of one stream of logits."""

    def __init__(self, num_classes: int, device: torch.device) -> None:
        self.num_classes, self.k = num_classes, min(5, num_classes)
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, top-k hits

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """logits (B, K) float32, labels (B,)."""
        self.sums[0] += F.cross_entropy(logits, labels, reduction="sum")
        topk = logits.topk(self.k, dim=1).indices  # (B, k)
        self.sums[1] += (topk == labels[:, None]).any(dim=1).sum()
        K = self.num_classes
        self.confusion += torch.bincount(labels * K + topk[:, 0], minlength=K**2).view(K, K)

    def result(self) -> dict:
        """Summed over processes: floats in [0, 1], `confusion` a (K, K) int64 numpy array."""
        process_group.all_reduce_sum(self.confusion)
        process_group.all_reduce_sum(self.sums)
        confusion = self.confusion.cpu().numpy()
        total = int(confusion.sum())
        if total == 0:
            raise ValueError("evaluation saw no images")
        per_class_total = confusion.sum(axis=1)
        return {
            "top1": float(np.trace(confusion) / total),
            "top5": float(self.sums[1].item() / total),
            "loss": float(self.sums[0].item() / total),
            "per_class": [
                float(confusion[i, i] / n) if n else float("nan")
                for i, n in enumerate(per_class_total)
            ],
            "num_images": total,
            "confusion": confusion,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    num_classes: int,
    device: torch.device,
    amp: bool = False,
    amp_dtype: str = "bfloat16",
    progress: bool = False,
    tta: str = "none",
) -> dict:
    """Top-1, top-5, per-class accuracy, confusion matrix and mean loss over a loader.

    tta (a vit.inference.options.TTA_CHOICES other than "none") adds `result["tta"]`: the same
    figures for the mean softmax probability of each image's views (vit.inference.tta), measured in
    the same pass as the plain ones, which are the first view's.
    Under DDP each process evaluates its shard and the counts are summed over processes.
    Returns floats in [0, 1] and `confusion` as a (K, K) int64 numpy array (rows: true class).
    """
    if tta not in TTA_CHOICES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; accepted: {TTA_CHOICES}")
    model.eval()
    # The shifted views' border is black; the model's preprocess says what black is normalised.
    fill = black_pixel(getattr(model, "preprocess", None)).to(device)
    plain, augmented = _Tally(num_classes, device), _Tally(num_classes, device)
    bar = tqdm(loader, desc="eval", leave=False, disable=None if progress else True)
    for images, labels in bar:  # disable=None: a bar on a terminal only
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast(device, amp, amp_dtype):
            logits, tta_log_probs = tta_logits(model, images, tta, fill)  # each (B, K)
        plain.add(logits, labels)
        if tta != "none":
            augmented.add(tta_log_probs, labels)
    result = plain.result()
    if tta != "none":
        result["tta"] = augmented.result()
    return result
