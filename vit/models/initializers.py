"""Training-time initialisations that leave the architecture and its state dict unchanged.

Each acts on an already built `VisionTransformer`, so a model trained with them saves, loads
and runs in timm exactly like any other:

* `mimetic_init_`: attention weights that start out behaving like the attention of a
  trained ViT (Trockman & Kolter, ICML 2023, "Mimetic Initialization of Self-Attention
  Layers"). In trained ViTs the product W_q W_k^T of each head is close to a positive
  multiple of the identity plus noise (a token attends to tokens like itself, and through the
  position embeddings to its neighbours), and W_v W_proj is close to a negative multiple of the
  identity plus noise. Starting there costs nothing per step and helps most when data or
  epochs are scarce.
* `sincos_pos_embed_`: fixed 2-D sine-cosine position embeddings (Beyer et al. 2022, "Better
  plain ViT baselines for ImageNet-1k"), stored in `pos_embed` with gradients off.
* `whiten_patch_embed_`: a patch embedding that whitens the training images' patches: the
  first layer's data-dependent start in airbench's CNNs for CIFAR-10 (a fixed convolution of
  2x2 patches; in its ablations, KellerJordan/cifar10-zoo, 94% in 21 epochs instead of 35).
  Pixels within a patch are strongly correlated, so a few directions of the patch space carry
  most of its variance, and a random projection of it learns slowly along the rest; whitened,
  every direction starts out equally loud. Here the layer stays linear and keeps training.

Shape legend: D embed dim, nh heads, hs head size (D // nh), gh/gw patch grid, K the values of
one patch (C * p * p), L the patches of an image (gh * gw).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .vision_transformer import Attention

# The paper's values for ViTs trained from scratch on CIFAR-10 (their Section 4).
MIMETIC_QK = (0.7, 0.7)  # W_q W_k^T ~ alpha * Z + beta * I
MIMETIC_VPROJ = (0.4, 0.4)  # W_v W_proj ~ alpha * Z - beta * I


def _factor(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (rank, D) matrices A, B with A^T B the best rank-`rank` approximation of target."""
    U, S, Vh = torch.linalg.svd(target)  # target (D, D) = U diag(S) Vh
    root = S[:rank].sqrt()  # (rank,)
    return root[:, None] * U[:, :rank].T, root[:, None] * Vh[:rank]  # each (rank, D)


@torch.no_grad()
def mimetic_init_(
    model: nn.Module,
    qk: tuple[float, float] = MIMETIC_QK,
    vproj: tuple[float, float] = MIMETIC_VPROJ,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Re-initialise every attention layer's qkv and proj weights mimetically, in place.

    For each head h, with Z a (D, D) Gaussian of variance 1/D:
        W_q[h]^T W_k[h] ~ qk[0] * Z + qk[1] * I        (rank hs, the head size)
    and for the whole layer (all heads side by side, full rank):
        W_v^T W_proj^T ~ vproj[0] * Z' - vproj[1] * I
    Here W_q[h] is the (hs, D) block of `qkv.weight` that computes head h's queries, so the
    attention score of tokens x, y is x W_q[h]^T W_k[h] y^T (before the 1/sqrt(hs) scale).
    Biases are left as they are (zero after the default initialisation).
    """
    for module in model.modules():
        if not isinstance(module, Attention):  # the attention pool has no fused qkv: skipped
            continue
        qkv, proj = module.qkv, module.proj
        dim, heads = proj.in_features, module.num_heads
        head_dim = dim // heads
        eye = torch.eye(dim)
        w_q, w_k, w_v = qkv.weight.view(3, dim, dim).unbind(0)  # views into qkv.weight
        for h in range(heads):
            z = torch.randn(dim, dim, generator=generator) / math.sqrt(dim)
            a, b = _factor(qk[0] * z + qk[1] * eye, head_dim)
            rows = slice(h * head_dim, (h + 1) * head_dim)
            w_q[rows], w_k[rows] = a, b
        z = torch.randn(dim, dim, generator=generator) / math.sqrt(dim)
        a, b = _factor(vproj[0] * z - vproj[1] * eye, dim)
        w_v.copy_(a)  # (D, D): values of all heads
        proj.weight.copy_(b.T)  # proj computes y = x proj.weight^T, so W_v^T W_proj^T = a^T b
    return model


def sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embeddings, (gh*gw, D), row-major like the patch tokens.

    A quarter of the channels each: sin and cos of the row index, sin and cos of the column
    index, at geometrically spaced frequencies (big_vision's `posemb_sincos_2d`'s, which puts
    the column's quarters first).
    """
    if dim % 4:
        raise ValueError(f"sin-cos position embeddings need embed_dim divisible by 4, got {dim}")
    rows, cols = torch.meshgrid(
        torch.arange(grid[0], dtype=torch.float32),
        torch.arange(grid[1], dtype=torch.float32),
        indexing="ij",
    )  # each (gh, gw)
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4 - 1 or 1))
    rows = rows.reshape(-1, 1) * omega  # (gh*gw, D/4)
    cols = cols.reshape(-1, 1) * omega  # (gh*gw, D/4)
    return torch.cat([rows.sin(), rows.cos(), cols.sin(), cols.cos()], dim=1)  # (gh*gw, D)


@torch.no_grad()
def sincos_pos_embed_(model: nn.Module) -> nn.Module:
    """Fill `model.pos_embed` with fixed 2-D sin-cos embeddings and stop training it.

    Prefix tokens (class token) get zeros, as in big_vision, where the class token has no
    position. The tensor keeps its name and shape, so the state dict loads anywhere as usual.
    """
    pos = model.pos_embed  # (1, prefix + gh*gw, D)
    prefix = pos.shape[1] - model.grid_size[0] * model.grid_size[1]
    pos.zero_()
    pos[0, prefix:] = sincos_2d(model.grid_size, pos.shape[-1])
    pos.requires_grad_(False)
    return model


# Directions of the patch space with less variance than this (a normalised pixel's is ~1) are
# damped instead of raised to the variance of the others: JPEG noise, mostly. airbench's is 5e-4
# for 12 values a patch; 48 and more hold more near-empty directions, so more is damped here.
WHITEN_EPS = 1e-2
# The default initialisation's standard deviation of the patch embedding's weights (this
# package's `init_weights`; timm's leaves the conv at PyTorch's default):
# the whitened embedding keeps the tokens' expected size, so only their directions change.
DEFAULT_STD = 0.02


def patch_moments(
    batches: Iterable[torch.Tensor], patch_size: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean (K,) and covariance (K, K) of the non-overlapping patches of images (B, C, H, W),
    each patch flattened as the patch embedding's weight is, (C, p, p); in float64, summed batch
    by batch so that the patches of all the images are never in memory at once."""
    count, total, products = 0, 0.0, 0.0  # the sums become (K,) and (K, K) at the first batch
    for images in batches:
        patches = F.unfold(images.double(), kernel_size=patch_size, stride=patch_size)  # (B, K, L)
        patches = patches.transpose(1, 2).flatten(0, 1)  # (B*L, K)
        total, products = total + patches.sum(0), products + patches.T @ patches
        count += len(patches)
    if not count:
        raise ValueError("no images to measure the patches of")
    mean = total / count  # (K,)
    return mean, products / count - torch.outer(mean, mean)  # (K, K)


@torch.no_grad()
def whiten_patch_embed_(
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    eps: float = WHITEN_EPS,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Re-initialise `model.patch_embed.proj` so that it whitens the patches of `batches`, in place.

    batches: images (B, C, H, W) as the model takes them (normalised, at its input size). With
    the patches' mean mu and covariance V diag(lam) V^T (its k = min(D, K) largest directions):
        weight = s * R diag((lam + eps)^-1/2) V^T        (D, K), reshaped (D, C, p, p)
        bias   = -weight mu                              (the tokens start centred)
    R (D, k) has orthonormal columns drawn at random, so the k whitened directions are spread
    over the D channels, and s gives the tokens the expected squared size that the default
    initialisation (normal, std 0.02) gives them: D * 0.02^2 * trace of the covariance.
    """
    proj = model.patch_embed.proj  # Conv2d (D, C, p, p), stride p
    dim = proj.out_channels
    mean, cov = patch_moments(batches, proj.kernel_size)
    values, vectors = torch.linalg.eigh(cov)  # ascending
    k = min(dim, len(values))
    values, vectors = values.flip(0)[:k].clamp_min(0), vectors.flip(1)[:, :k]  # (k,), (K, k)
    rotation = torch.linalg.qr(torch.randn(dim, k, generator=generator, dtype=cov.dtype)).Q
    kept = (values / (values + eps)).sum()  # the whitened tokens' expected squared size, s = 1
    scale = DEFAULT_STD * (dim * cov.trace() / kept).sqrt()
    weight = scale * rotation @ torch.diag((values + eps).rsqrt()) @ vectors.T  # (D, K)
    proj.weight.copy_(weight.view_as(proj.weight))
    if proj.bias is not None:
        proj.bias.copy_(-weight @ mean)
    return model
