"""A small convolutional network for small images, written to be a ViT's teacher.

A plain ViT trained from scratch on 50,000 CIFAR images has none of a convolution's prior of
locality, and learns it slowly from the data; a small CNN learns the task in a few epochs.
DeiT (Touvron et al. 2021) trained its ViTs to follow a CNN's predictions of each augmented
image as well as the labels, and its students passed their teacher.
`--distillation-type` (`vit.training.distillation`) trains this network first, in the same
command, then the ViT against it; the ViT stays the plain model it was.

    stem    conv 3x3 (3 -> w1)                           (B, w1, H, W)
            or whiten: conv 2x2 (3 -> 24), frozen        (B, 24, H-1, W-1)
    stage 1 conv 3x3 (-> w1),     max-pool 2, conv 3x3   (B, w1, H/2, W/2)
    stage 2 conv 3x3 (w1 -> w2),  max-pool 2, conv 3x3   (B, w2, H/4, W/4)
    stage 3 conv 3x3 (w2 -> w3),  max-pool 2, conv 3x3   (B, w3, H/8, W/8)
    head    global max-pool, linear, x logit_scale       (B, K)

Each conv is followed by batch norm and GELU; the pool comes right after a stage's first conv,
so that its second conv runs at the smaller size (the DAWNBench ResNets' habit: the same depth
for a quarter of the arithmetic). The stages' widths are w times `channel_mult` (as a
diffusion U-Net's `ch` and `ch_mult`): (1, 2, 4) by default, (w, 2w, 4w), 1.19M parameters
and 0.21 GFLOP a forward pass per image at w = 64 and 32 px, against the speedrun ViT's 0.55;
(1, 4, 4) is airbench's (64, 256, 256), 1.97M and 0.24 GFLOP after a whitening stem.

The whitening stem (hlb-cifar10's and airbench's, the CIFAR-10 speedruns of tysam-code and
Keller Jordan): a 2x2 convolution whose 24 filters are the 12 principal directions of the
training images' 2x2 patches, each scaled to unit variance, and their negatives (GELU keeps
both signs), followed by GELU without a norm; its weights are measured from the images
(`whiten_stem_`) and never trained, its bias is. The first stage then starts from decorrelated
inputs instead of learning to decorrelate them, which airbench's ablations credit with reaching
94% in 21 epochs instead of 35 (CIFAR-10, with flip TTA).

Shape legend: B batch, C channels, H/W image height/width, w width, K classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from .initializers import patch_moments

STEMS = ("conv", "whiten")
WHITEN_KERNEL = 2
WHITEN_EPS = 5e-4  # added to the eigenvalues: the faintest directions are not blown up to 1


class ConvBnAct(nn.Sequential):
    """conv 3x3 (padding 1, no bias: the norm's shift is the bias) -> batch norm -> GELU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.GELU(),
        )


class WhitenStem(nn.Module):
    """conv 2x2 (3 -> 2 * 3 * 2 * 2 = 24, no padding), GELU: (B, 3, H, W) -> (B, 24, H-1, W-1).

    Until `whiten_stem_` measures the images, the filters are an orthonormal basis of the
    patches and its negative (a stem that passes everything through), so that a teacher built
    to load saved weights into needs no images."""

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        patch = in_channels * WHITEN_KERNEL * WHITEN_KERNEL
        self.conv = nn.Conv2d(in_channels, 2 * patch, kernel_size=WHITEN_KERNEL, bias=True)
        self.conv.weight.requires_grad_(False)  # measured, not learnt
        basis = torch.eye(patch).view(patch, in_channels, WHITEN_KERNEL, WHITEN_KERNEL)
        with torch.no_grad():
            self.conv.weight.copy_(torch.cat([basis, -basis]))
            self.conv.bias.zero_()
        self.act = nn.GELU()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(images))


class Stage(nn.Module):
    """conv, 2x2 max-pool, conv: (B, C_in, H, W) -> (B, C_out, H/2, W/2). The pool comes after
    the first conv's norm and GELU, or with pool_before_norm between the conv and its norm
    (airbench's order: the norm's statistics are the pooled maxima's)."""

    def __init__(self, in_channels: int, out_channels: int, pool_before_norm: bool = False) -> None:
        super().__init__()
        self.conv1 = ConvBnAct(in_channels, out_channels)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = ConvBnAct(out_channels, out_channels)
        self.pool_before_norm = pool_before_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool_before_norm:
            conv, norm, act = self.conv1
            return self.conv2(act(norm(self.pool(conv(x)))))
        return self.conv2(self.pool(self.conv1(x)))


CHANNEL_MULT = (1, 2, 4)  # the stages' widths per unit of width: (w, 2w, 4w)


class CnnTeacher(nn.Module):
    """The teacher: (B, 3, H, W) normalised images -> (B, K) logits.

    width: the unit of the stages' channels, w; channel_mult: the three stages' widths in
        units of it, (w1, w2, w3) = w x channel_mult (airbench's network: 64, (1, 4, 4)); a
        conv stem has w1.
    stem: "conv" (3x3, batch norm, GELU) or "whiten" (see the module's notes; call
        `whiten_stem_` with training images before training).
    logit_scale: the head's output times this (airbench's 1/9: logits that start small and
        grow slowly, so label smoothing's targets are reached late in training).
    pool_before_norm: each stage's pool between its first conv and that conv's norm (`Stage`).
    """

    def __init__(
        self,
        num_classes: int,
        width: int = 64,
        *,
        channel_mult: Sequence[int] = CHANNEL_MULT,
        stem: str = "conv",
        logit_scale: float = 1.0,
        pool_before_norm: bool = False,
    ) -> None:
        super().__init__()
        if width < 1 or num_classes < 1:
            raise ValueError(
                f"CnnTeacher needs width >= 1 and classes >= 1: {width}, {num_classes}"
            )
        if stem not in STEMS:
            raise ValueError(f"CnnTeacher's stem must be one of {list(STEMS)}, got {stem!r}")
        if len(channel_mult) != 3 or min(channel_mult) < 1:
            raise ValueError(
                f"CnnTeacher's channel_mult needs three multipliers >= 1, got {list(channel_mult)}"
            )
        w1, w2, w3 = (width * m for m in channel_mult)
        self.num_classes, self.width = num_classes, width
        self.channel_mult, self.widths = tuple(channel_mult), (w1, w2, w3)
        self.stem_kind = stem
        self.stem = ConvBnAct(3, w1) if stem == "conv" else WhitenStem(3)
        stem_out = w1 if stem == "conv" else self.stem.conv.out_channels
        pool_first = {"pool_before_norm": pool_before_norm}
        self.stages = nn.Sequential(
            Stage(stem_out, w1, **pool_first),
            Stage(w1, w2, **pool_first),
            Stage(w2, w3, **pool_first),
        )
        self.pool_before_norm = pool_before_norm
        self.head = nn.Linear(w3, num_classes)
        self.logit_scale = logit_scale

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))  # (B, w3, ~H/8, ~W/8)
        return self.head(x.amax(dim=(2, 3))) * self.logit_scale  # (B, K)


@torch.no_grad()
def whiten_stem_(
    teacher: CnnTeacher, batches: Iterable[torch.Tensor], eps: float = WHITEN_EPS
) -> CnnTeacher:
    """Set a whitening stem's filters from the 2x2 patches of `batches` (B, 3, H, W), normalised
    as the teacher takes them, in place: with the patches' covariance V diag(lam) V^T,
        weight = [V diag((lam + eps)^-1/2); -V diag((lam + eps)^-1/2)]^T    (24, 3, 2, 2)
        bias   = -weight mu                                                  (centred outputs)
    so each filter's output has unit variance over the images, the first 12 uncorrelated (the
    other 12 their negatives)."""
    if not isinstance(teacher.stem, WhitenStem):
        raise ValueError(
            f"whiten_stem_ needs a teacher with stem='whiten', not {teacher.stem_kind!r}"
        )
    conv = teacher.stem.conv
    mean, cov = patch_moments(batches, conv.kernel_size)  # (12,), (12, 12), float64
    values, vectors = torch.linalg.eigh(cov)  # ascending; columns are the directions
    filters = (vectors * (values.clamp_min(0) + eps).rsqrt()).T  # (12, 12): one per row
    weight = torch.cat([filters, -filters])  # (24, 12)
    conv.weight.copy_(weight.view_as(conv.weight))
    conv.bias.copy_(-weight @ mean)
    return teacher


@torch.no_grad()
def dirac_init_(teacher: CnnTeacher) -> CnnTeacher:
    """Each 3x3 conv of the stages (not the stem, as in airbench): its first min(in, out)
    filters set to pass their input channel through unchanged (the rest keep their random
    start), so every such conv starts as a partial identity, as if the network had residual
    connections."""
    for module in teacher.stages.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.dirac_(module.weight[: module.in_channels])
    return teacher
