"""A small convolutional network for small images, written to be a ViT's teacher.

A plain ViT trained from scratch on 50,000 CIFAR images has none of a convolution's prior of
locality, and learns it slowly from the data; a small CNN learns the task in a few epochs.
DeiT (Touvron et al. 2021) trained its ViTs to follow a CNN's predictions of each augmented
image as well as the labels, and its students passed their teacher. `--distillation-type`
(`vit.training.distillation`) trains this network first, in the same command, then the ViT
against it; the ViT stays the plain model it was.

    stem    conv 3x3 (3 -> w)                           (B, w, H, W)
    stage 1 conv 3x3 (w -> w),   max-pool 2, conv 3x3   (B, w, H/2, W/2)
    stage 2 conv 3x3 (w -> 2w),  max-pool 2, conv 3x3   (B, 2w, H/4, W/4)
    stage 3 conv 3x3 (2w -> 4w), max-pool 2, conv 3x3   (B, 4w, H/8, W/8)
    head    global max-pool, linear                     (B, K)

Each conv is followed by batch norm and GELU; the pool comes right after a stage's first conv,
so that its second conv runs at the smaller size (the DAWNBench ResNets' habit: the same depth
for a quarter of the arithmetic). At w = 64 and 32 px: 1.19M parameters, 0.21 GFLOP a forward
pass per image, against the speedrun ViT's 0.55.

Shape legend: B batch, C channels, H/W image height/width, w base width, K classes.
"""

from __future__ import annotations

import torch
from torch import nn


class ConvBnAct(nn.Sequential):
    """conv 3x3 (padding 1, no bias: the norm's shift is the bias) -> batch norm -> GELU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.GELU(),
        )


class Stage(nn.Module):
    """conv, 2x2 max-pool, conv: (B, C_in, H, W) -> (B, C_out, H/2, W/2)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = ConvBnAct(in_channels, out_channels)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = ConvBnAct(out_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.pool(self.conv1(x)))


class CnnTeacher(nn.Module):
    """The teacher: (B, 3, H, W) normalised images -> (B, K) logits; H and W multiples of 8.

    width: channels of the stem and the first stage; the later stages double them twice.
    """

    def __init__(self, num_classes: int, width: int = 64) -> None:
        super().__init__()
        if width < 1 or num_classes < 1:
            raise ValueError(
                f"CnnTeacher needs width >= 1 and classes >= 1: {width}, {num_classes}"
            )
        self.num_classes, self.width = num_classes, width
        self.stem = ConvBnAct(3, width)
        self.stages = nn.Sequential(
            Stage(width, width), Stage(width, 2 * width), Stage(2 * width, 4 * width)
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))  # (B, 4w, H/8, W/8)
        return self.head(x.amax(dim=(2, 3)))  # (B, K)
