"""The Vision Transformer (Dosovitskiy et al., 2021), written from scratch.

An image is cut into non-overlapping patches, each patch is projected to a token, a learned
class token is prepended, learned position embeddings are added, and a stack of pre-norm
transformer blocks mixes the tokens. The class token (or the mean of the patch tokens) is
classified by a linear head.

Parameter names are timm's (`patch_embed.proj`, `blocks.{i}.attn.qkv`, ...), so a timm
`VisionTransformer` state dict loads here strictly and ours loads into timm strictly.

Shape legend used in comments:
    B batch, C channels, H/W image height/width, gh/gw patch-grid height/width,
    N tokens (prefix + gh*gw), D embed dim, nh heads, hs head size (D // nh).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .pos_embed import resample_abs_pos_embed


def to_pair(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """An int means a square; a pair is (height, width)."""
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or an (height, width) pair, got {value!r}")
    if min(pair) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return pair


@dataclass
class ViTConfig:
    """Everything that defines the architecture; saved beside weights so they load alone."""

    img_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["token", "avg"] = "token"
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    fc_norm: bool | None = None  # None: timm's default, a norm after pooling only for "avg"
    # LayerNorm epsilon everywhere: 1e-6 as in the JAX ViT and timm (PyTorch's default is 1e-5,
    # transformers' ViT uses 1e-12); a checkpoint's own value is needed to reproduce its logits.
    norm_eps: float = 1e-6
    drop_rate: float = 0.0  # dropout before the head
    pos_drop_rate: float = 0.0  # dropout after adding position embeddings
    proj_drop_rate: float = 0.0  # dropout after the attention projection and in the MLP
    attn_drop_rate: float = 0.0  # dropout on the attention probabilities
    drop_path_rate: float = 0.0  # stochastic depth, rising linearly with depth to this value
    patch_drop_rate: float = 0.0  # in training, drop this fraction of patch tokens at random
    dynamic_img_size: bool = False  # accept any multiple of the patch size; resample pos_embed

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def uses_fc_norm(self) -> bool:
        """Whether the final LayerNorm comes after pooling (fc_norm) instead of before it."""
        return self.global_pool == "avg" if self.fc_norm is None else bool(self.fc_norm)


class PatchEmbed(nn.Module):
    """Image to patch tokens: a Conv2d whose kernel and stride are both the patch size."""

    def __init__(
        self, img_size, patch_size, in_chans: int, embed_dim: int, dynamic_img_size: bool = False
    ) -> None:
        super().__init__()
        self.dynamic_img_size = dynamic_img_size
        self.img_size = to_pair(img_size, "img_size")
        self.patch_size = to_pair(patch_size, "patch_size")
        for side, image, patch in zip(
            ("height", "width"), self.img_size, self.patch_size, strict=True
        ):
            if image % patch:
                raise ValueError(
                    f"img_size {side} {image} is not a multiple of patch_size {side} {patch}"
                )
        self.grid_size = (
            self.img_size[0] // self.patch_size[0],
            self.img_size[1] // self.patch_size[1],
        )
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, self.patch_size, stride=self.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        if self.dynamic_img_size:
            if H % self.patch_size[0] or W % self.patch_size[1]:
                raise ValueError(
                    f"input image size ({H}x{W}) is not a multiple of the patch size "
                    f"({self.patch_size[0]}x{self.patch_size[1]})"
                )
        elif (H, W) != self.img_size:
            raise ValueError(
                f"input image size ({H}x{W}) does not match the model's img_size "
                f"({self.img_size[0]}x{self.img_size[1]}); resize the images or create the "
                f"model with img_size=({H}, {W}) or dynamic_img_size=True"
            )
        x = self.proj(x)  # (B, D, gh, gw)
        return x.flatten(2).transpose(1, 2)  # (B, gh*gw, D)


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection.

    Two paths give the same result: PyTorch's fused `scaled_dot_product_attention` (the default,
    fast, never materialises the attention matrix) and an explicit softmax whose probabilities
    pass through `self.softmax`, a module that forward hooks can observe. Set `fused_attn =
    False` to take the explicit path, e.g. to capture attention maps.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.softmax = nn.Softmax(dim=-1)  # parameter-free; here so hooks can see probabilities
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        # One matmul gives q, k and v for every head: (B, N, 3*D) -> (3, B, nh, N, hs)
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, nh, N, hs)
        if self.fused_attn:
            dropout_p = self.attn_drop.p if self.training else 0.0
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)  # (B, nh, N, hs)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, nh, N, N)
            attn = self.softmax(attn)  # each row sums to one: how a query spreads over keys
            attn = self.attn_drop(attn)
            x = attn @ v  # (B, nh, N, hs)
        x = x.transpose(1, 2).reshape(B, N, D)  # heads side by side again: (B, N, D)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    """Two linear layers with a GELU between: D -> hidden -> D."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: in training, skip a residual branch for a random subset of samples.

    Kept samples are scaled by 1/keep_prob so the expected output is unchanged.
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep_prob = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep_prob)  # (B, 1, 1)
        if keep_prob > 0.0:  # with drop_prob 1 every branch is dropped: nothing to rescale
            mask.div_(keep_prob)
        return x * mask

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class PatchDropout(nn.Module):
    """In training, keep a random subset of the patch tokens of each image (prefix tokens stay).

    Fewer tokens make every block cheaper, so more images fit in the same time (Liu et al.
    2023, "PatchDropout"). Evaluation always sees every token.
    """

    def __init__(self, prob: float, num_prefix_tokens: int) -> None:
        super().__init__()
        if not 0.0 <= prob < 1.0:
            raise ValueError(f"patch_drop_rate must be in [0, 1), got {prob}")
        self.prob = prob
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.prob == 0.0:
            return x
        prefix, patches = x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :]
        B, L, D = patches.shape
        keep = max(1, int(L * (1.0 - self.prob)))
        # A random permutation per image; its first `keep` entries are the kept tokens.
        kept = torch.randn(B, L, device=x.device).argsort(dim=1)[:, :keep]  # (B, keep)
        patches = patches.gather(1, kept[:, :, None].expand(-1, -1, D))  # (B, keep, D)
        return torch.cat([prefix, patches], dim=1)  # (B, prefix + keep, D)

    def extra_repr(self) -> str:
        return f"prob={self.prob}"


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop
        )
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))  # (B, N, D)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))  # (B, N, D)
        return x


class VisionTransformer(nn.Module):
    """ViT classifier. All arguments are keyword-only; see `ViTConfig` for their meaning."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        unknown = set(kwargs) - set(ViTConfig.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"unknown VisionTransformer argument(s) {sorted(unknown)}; "
                f"accepted: {sorted(ViTConfig.__dataclass_fields__)}"
            )
        cfg = ViTConfig(**kwargs)
        if cfg.global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {cfg.global_pool!r}")
        if cfg.global_pool == "token" and not cfg.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")
        self.config = cfg
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.embed_dim = self.num_features = cfg.embed_dim
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        use_fc_norm = cfg.uses_fc_norm

        self.patch_embed = PatchEmbed(
            cfg.img_size,
            cfg.patch_size,
            cfg.in_chans,
            cfg.embed_dim,
            dynamic_img_size=cfg.dynamic_img_size,
        )
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.class_token else None
        self.pos_embed = nn.Parameter(
            torch.zeros(1, num_patches + self.num_prefix_tokens, cfg.embed_dim)
        )
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        self.patch_drop = PatchDropout(cfg.patch_drop_rate, self.num_prefix_tokens)
        # stochastic depth rises linearly from 0 at the first block to drop_path_rate at the last
        drop_path_rates = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.Sequential(
            *[
                Block(
                    cfg.embed_dim,
                    cfg.num_heads,
                    mlp_ratio=cfg.mlp_ratio,
                    qkv_bias=cfg.qkv_bias,
                    proj_drop=cfg.proj_drop_rate,
                    attn_drop=cfg.attn_drop_rate,
                    drop_path=rate,
                    norm_eps=cfg.norm_eps,
                )
                for rate in drop_path_rates
            ]
        )
        # timm's layout: the final norm sits before pooling, or after it (fc_norm) for "avg"
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.fc_norm = (
            nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps) if use_fc_norm else nn.Identity()
        )
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = self._make_head(cfg.num_classes)
        self.init_weights()
        # Set by vit.create_model / vit.load_model, saved beside the weights by vit.save_weights.
        self.model_name: str | None = None
        self.class_names: list[str] | None = None  # one per output, in output order
        self.preprocess = None  # a vit.Preprocess: how images must be prepared for this model

    # -- construction ------------------------------------------------------------------------
    def _make_head(self, num_classes: int) -> nn.Module:
        return nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    @torch.no_grad()
    def init_weights(self) -> None:
        """ViT paper / timm initialisation: truncated normal(0.02) weights, zero biases, a zero
        head so that training starts from uniform predictions, a near-zero class token."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        self._zero_head()

    @torch.no_grad()
    def _zero_head(self) -> None:
        # A zero head predicts uniformly at first, so early gradients do not chase random logits.
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a fresh (zero) one for `num_classes` (0 removes it)."""
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a class token; this model has none")
            self.global_pool = self.config.global_pool = global_pool
        self.num_classes = self.config.num_classes = num_classes
        self.head = self._make_head(num_classes).to(self.pos_embed.device)
        self._zero_head()

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay should skip (the optimizer also skips biases/norms)."""
        return {"pos_embed", "cls_token"}

    def set_fused_attn(self, enabled: bool) -> None:
        """Switch every block between fused SDPA (True) and the explicit softmax path."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.fused_attn = enabled

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.patch_embed.grid_size

    # -- forward -----------------------------------------------------------------------------
    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        pos_embed = self.pos_embed  # (1, N, D) for the model's own grid
        if grid != self.grid_size:  # only with dynamic_img_size: another input size
            # Differentiable, so training at a smaller size still trains the full-size embeddings.
            pos_embed = resample_abs_pos_embed(
                pos_embed, grid, self.grid_size, num_prefix_tokens=self.num_prefix_tokens
            )
        if self.cls_token is not None:
            cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, D)
            x = torch.cat([cls, x], dim=1)  # (B, N, D)
        return self.pos_drop(x + pos_embed)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> normalised tokens (B, N, D), prefix tokens first.

        In training with patch_drop_rate > 0, N counts only the kept patch tokens.
        """
        grid = (
            x.shape[-2] // self.patch_embed.patch_size[0],
            x.shape[-1] // self.patch_embed.patch_size[1],
        )
        x = self.patch_embed(x)  # (B, gh*gw, D)
        x = self._pos_embed(x, grid)  # (B, N, D)
        x = self.patch_drop(x)  # (B, N', D), N' <= N in training only
        x = self.blocks(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens (B, N, D) -> logits (B, num_classes), or pooled features (B, D) if pre_logits."""
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, D)
        else:
            x = x[:, 0]  # the class token, (B, D)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
