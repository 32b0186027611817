"""The Vision Transformer (Dosovitskiy et al., 2021), written from scratch.

An image is cut into non-overlapping patches, each patch is projected to a token, learned
prefix tokens (a class token) are prepended, learned position embeddings are added, and a stack
of pre-norm transformer blocks mixes the tokens. The class token (or the mean of the patch
tokens) is classified by a linear head.

The ViT families in use today are this model with a few switches (timm's names), each a small
module (here or in `vit.models.layers`) or a few lines: LayerScale `init_values` (DINOv2, DeiT III),
register tokens `reg_tokens` and patch-only position embeddings `no_embed_class` (DINOv2 with
registers, DeiT III), a LayerNorm before the blocks `pre_norm` (CLIP), the MLP activation
`act_layer` (QuickGELU: OpenAI CLIP), a gated MLP `mlp_layer="swiglu_packed"` (DINOv2
ViT-g/14) and an attention-pool readout `global_pool="map"` (SigLIP). DeiT's distillation token
with its own head (`distilled`) is more than a switch: the small subclass
`VisionTransformerDistilled` at the end, as timm's. `vit.models.families` says which switches
make which family.

Parameter names are timm's (`patch_embed.proj`, `blocks.{i}.attn.qkv`, `blocks.{i}.ls1.gamma`,
`reg_token`, `norm_pre`, `attn_pool.*`, `dist_token`, `head_dist`, ...), so a timm
`VisionTransformer` state dict loads here strictly and ours loads into timm strictly.

Shape legend used in comments:
    B batch, C channels, H/W image height/width, gh/gw patch-grid height/width,
    P prefix tokens (class + distillation + registers), N tokens (P + gh*gw),
    D embed dim, nh heads, hs head size (D // nh).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from numbers import Integral, Real
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..utils.ranges import AT_LEAST_0, AT_LEAST_1, DROP_RATE, POSITIVE, out_of_range

# QuickGELU re-exported with the others: `vit.models.vision_transformer.<layer>` names keep working.
from .layers import ACT_LAYERS, DropPath, LayerScale, PatchDropout, QuickGELU  # noqa: F401
from .pos_embed import RESAMPLERS, resample_pos_embed, resamples_always
from .registry import pretrained_cfg_of


class ConfigValueError(ValueError):
    """An architecture setting the model cannot take; `fields` names the ViTConfig fields to
    blame (train.py names --model-kwargs when the user gave one of them there)."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


def to_pair(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """An int means a square; a pair is (height, width)."""
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = (int(value[0]), int(value[1]))
    else:
        raise ConfigValueError(
            f"{name} must be an int or an (height, width) pair, got {value!r}", name
        )
    if min(pair) <= 0:
        raise ConfigValueError(f"{name} must be positive, got {value!r}", name)
    return pair


@dataclass
class ViTConfig:
    """Everything that defines the architecture; saved beside weights so they load alone."""

    img_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_chans: int = 3
    num_classes: int = 1000
    # "token": the class token; "avg": mean of the patch tokens ("max": their maximum, "avgmax":
    # the mean of both, timm's); "map": an attention-pool readout (SigLIP); "": no pooling, the
    # head sees every token
    global_pool: Literal["token", "avg", "avgmax", "max", "map", ""] = "token"
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    fc_norm: bool | None = None  # None: timm's default, a norm after pooling the patch tokens
    init_values: float | None = None  # LayerScale on both residual branches (DINOv2, DeiT III)
    reg_tokens: int = 0  # register tokens after the class token (DINOv2 with registers)
    no_embed_class: bool = False  # position embeddings for the patches only (DeiT III, DINOv2-reg)
    pre_norm: bool = False  # LayerNorm before the blocks, patch projection without bias (CLIP)
    act_layer: Literal["gelu", "gelu_tanh", "quick_gelu", "silu"] = "gelu"  # quick_gelu: CLIP
    # "mlp": Linear, activation, Linear; "swiglu_packed": a gated MLP whose first Linear packs
    # the gate and the value (timm's SwiGLUPacked, with act_layer="silu": DINOv2 ViT-g/14)
    mlp_layer: Literal["mlp", "swiglu_packed"] = "mlp"
    distilled: bool = False  # a distillation token with its own head (DeiT distilled)
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
    # how pos_embed is resampled to another grid (dynamic_img_size, set_input_size): the way the
    # weights' source library does it, so other sizes give its numbers
    # (vit.models.pos_embed.RESAMPLERS)
    pos_embed_resample: Literal["timm", "transformers", "dinov2", "torchvision"] = "timm"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def uses_fc_norm(self) -> bool:
        """Whether the final LayerNorm comes after pooling (fc_norm) instead of before it."""
        return self.global_pool in PATCH_POOLS if self.fc_norm is None else bool(self.fc_norm)


class PatchEmbed(nn.Module):
    """Image to patch tokens: a Conv2d whose kernel and stride are both the patch size."""

    def __init__(
        self,
        img_size,
        patch_size,
        in_chans: int,
        embed_dim: int,
        dynamic_img_size: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.dynamic_img_size = dynamic_img_size
        self.patch_size = to_pair(patch_size, "patch_size")
        self.set_input_size(img_size)
        self.proj = nn.Conv2d(
            in_chans, embed_dim, self.patch_size, stride=self.patch_size, bias=bias
        )

    def set_input_size(self, img_size) -> None:
        """The fixed input size (H, W) and its patch grid (gh, gw). A size refused leaves the
        module as it was."""
        self.grid_size = self.grid_of(img_size)
        self.img_size = to_pair(img_size, "img_size")
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    @property
    def margin(self) -> tuple[int, int]:
        """The pixels of img_size at the bottom and right that no patch sees: (0, 0) where the
        patches tile it."""
        return self.img_size[0] % self.patch_size[0], self.img_size[1] % self.patch_size[1]

    def grid_of(self, img_size) -> tuple[int, int]:
        """The patch grid (gh, gw) of an input size (H, W): as many whole patches as fit, as
        timm's and transformers' strided Conv2d cut them. A fixed size the patch does not
        divide leaves a margin at the bottom and right that no patch sees (SigLIP so400m at
        384 px: 27 x 27 patches of 14 px cover 378 px); a dynamic model takes multiples only,
        as its forward does. Otherwise a ConfigValueError."""
        size = to_pair(img_size, "img_size")
        for side, image, patch in zip(("height", "width"), size, self.patch_size, strict=True):
            problem = None
            if image < patch:
                problem = f"img_size {side} {image} is smaller than patch_size {side} {patch}"
            elif self.dynamic_img_size and image % patch:
                problem = (
                    f"img_size {side} {image} is not a multiple of patch_size {side} {patch}, "
                    f"which dynamic_img_size needs (a fixed img_size may leave a margin)"
                )
            if problem:
                raise ConfigValueError(problem, "img_size", "patch_size")
        return size[0] // self.patch_size[0], size[1] // self.patch_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4:  # one image (C, H, W) would fail below as "not enough values to unpack"
            raise ValueError(
                f"expected a batch of images (B, C, H, W), got a tensor of shape "
                f"{tuple(x.shape)}; one image (C, H, W) becomes a batch with x.unsqueeze(0)"
            )
        if not x.is_floating_point():  # raw pixels (0-255) would give logits of nothing
            raise ValueError(
                f"expected float images, normalised as the model's preprocessing says, got "
                f"{x.dtype}; vit.create_transform(model) prepares PIL images so"
            )
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
                f"({self.img_size[0]}x{self.img_size[1]}); resize the images, or build the "
                f"model with img_size=({H}, {W}) or dynamic_img_size=True (vit.create_model "
                f"and vit.load_model take both)"
            )
        # images come as float32; a model cast to bfloat16 (--model-dtype) takes them as they are
        x = self.proj(x.to(self.proj.weight.dtype))  # (B, D, gh, gw)
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
    """Two linear layers with an activation between: D -> hidden -> D."""

    def __init__(
        self, dim: int, hidden_dim: int, drop: float = 0.0, act_layer: str = "gelu"
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = ACT_LAYERS[act_layer]()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class SwiGLUPacked(nn.Module):
    """A gated MLP (Shazeer 2020, "GLU variants improve Transformer"): D -> hidden -> the
    product of its two halves, act(gate) * value -> D. timm's `SwiGLUPacked` (its `GluMlp` with
    the gate first), the DINOv2 code's `SwiGLUFFNFused` (`w12`, `w3`) under timm's names: fc1
    holds the gate's rows, then the value's."""

    def __init__(
        self, dim: int, hidden_dim: int, drop: float = 0.0, act_layer: str = "silu"
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)  # gate and value side by side: (2 * hidden/2, D)
        self.act = ACT_LAYERS[act_layer]()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim // 2, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # each (B, N, hidden / 2)
        return self.drop2(self.fc2(self.drop1(self.act(gate) * value)))

    @torch.no_grad()
    def init_gate_(self) -> None:
        """timm's start: the value's weights near zero and its bias one, so that the block
        begins as a plain MLP, fc2(act(gate))."""
        half = self.fc1.out_features // 2
        nn.init.normal_(self.fc1.weight[half:], std=1e-6)
        nn.init.ones_(self.fc1.bias[half:])


MLP_LAYERS = {"mlp": Mlp, "swiglu_packed": SwiGLUPacked}  # ViTConfig.mlp_layer -> its module


def holds_gated_mlp(state_dict) -> bool | None:
    """Whether timm-named weights hold a gated MLP (`SwiGLUPacked`: fc1 has twice as many rows
    as fc2 takes in, the gate's and the value's; a plain MLP as many); None without block 0's."""
    fc1, fc2 = state_dict.get("blocks.0.mlp.fc1.weight"), state_dict.get("blocks.0.mlp.fc2.weight")
    if fc1 is None or fc2 is None:
        return None
    return fc1.shape[0] == 2 * fc2.shape[1]


class AttentionPoolLatent(nn.Module):
    """SigLIP's readout ("map", multihead attention pooling): one learned query attends to the
    patch tokens, then a residual MLP. timm's `AttentionPoolLatent` names and maths.

    Like `Attention`, a fused path and an explicit one whose probabilities pass through
    `self.softmax`, so explanations can capture where the readout looks.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, norm_eps: float, act_layer: str):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # the learned query
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.softmax = nn.Softmax(dim=-1)  # parameter-free; here so hooks can see probabilities
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape  # L: the tokens pooled over
        q = self.q(self.latent).reshape(1, 1, self.num_heads, self.head_dim).transpose(1, 2)
        q = q.expand(B, -1, -1, -1)  # (B, nh, 1, hs)
        kv = self.kv(x).reshape(B, L, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)  # each (B, nh, L, hs)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)  # (B, nh, 1, hs)
        else:
            attn = self.softmax((q * self.scale) @ k.transpose(-2, -1))  # (B, nh, 1, L)
            x = attn @ v  # (B, nh, 1, hs)
        x = self.proj(x.transpose(1, 2).reshape(B, 1, D))  # (B, 1, D)
        x = x + self.mlp(self.norm(x))  # (B, 1, D)
        return x[:, 0]  # (B, D)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).

    With `init_values` each branch is scaled by a LayerScale (`ls1`, `ls2`) before the sum.
    """

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
        init_values: float | None = None,
        act_layer: str = "gelu",
        mlp_layer: str = "mlp",
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = MLP_LAYERS[mlp_layer](
            dim, int(dim * mlp_ratio), drop=proj_drop, act_layer=act_layer
        )
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))  # (B, N, D)
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # (B, N, D)
        return x


GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map", "")
PATCH_POOLS = ("avg", "avgmax", "max")  # pools over the patch tokens: fc_norm after them


class VisionTransformer(nn.Module):
    """ViT classifier. All arguments are keyword-only; see `ViTConfig` for their meaning.

    `VisionTransformer(distilled=True, ...)` builds a `VisionTransformerDistilled`
    (`model_class`), so every config builds its own class through one constructor.
    """

    def __new__(cls, **kwargs):
        if cls is VisionTransformer:  # the class a config needs: DeiT's distilled subclass
            cls = model_class(kwargs)
        return super().__new__(cls)

    def __init__(self, **kwargs) -> None:
        super().__init__()
        unknown = set(kwargs) - set(ViTConfig.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"unknown VisionTransformer argument(s) {sorted(unknown)}; "
                f"accepted: {sorted(ViTConfig.__dataclass_fields__)}"
            )
        cfg = ViTConfig(**kwargs)
        _check_config(cfg)
        self.config = cfg
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.embed_dim = self.num_features = cfg.embed_dim
        # Prefix tokens, in order: class, distillation (VisionTransformerDistilled), registers.
        self.num_prefix_tokens = int(cfg.class_token) + int(cfg.distilled) + cfg.reg_tokens
        self.num_reg_tokens = cfg.reg_tokens
        self.grad_checkpointing = False
        use_fc_norm = cfg.uses_fc_norm

        self.patch_embed = PatchEmbed(
            cfg.img_size,
            cfg.patch_size,
            cfg.in_chans,
            cfg.embed_dim,
            dynamic_img_size=cfg.dynamic_img_size,
            bias=not cfg.pre_norm,  # CLIP's projection has no bias: norm_pre follows it
        )
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.class_token else None
        self.reg_token = (
            nn.Parameter(torch.zeros(1, cfg.reg_tokens, cfg.embed_dim)) if cfg.reg_tokens else None
        )
        self.pos_embed = nn.Parameter(
            torch.zeros(1, num_patches + self.pos_embed_prefix_tokens, cfg.embed_dim)
        )
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        self.patch_drop = PatchDropout(cfg.patch_drop_rate, self.num_prefix_tokens)
        self.norm_pre = (
            nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()
        )
        self.blocks = _make_blocks(cfg)
        # timm's layout: the final norm sits before pooling, or after it (fc_norm) for a pool
        # over the patch tokens
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.attn_pool = (  # SigLIP's readout
            AttentionPoolLatent(
                cfg.embed_dim,
                cfg.num_heads,
                mlp_ratio=cfg.mlp_ratio,
                norm_eps=cfg.norm_eps,
                act_layer=cfg.act_layer,
            )
            if cfg.global_pool == "map"
            else None
        )
        self.fc_norm = (
            nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps) if use_fc_norm else nn.Identity()
        )
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self._make_heads(cfg)
        self.init_weights()
        # Set by vit.create_model / vit.load_model, saved beside the weights by vit.save_weights.
        self.model_name: str | None = None
        self.class_names: list[str] | None = None  # one per output, in output order
        self.preprocess = None  # a vit.Preprocess: how images must be prepared for this model
        self.load_report = None  # a vit.LoadReport: what loading pretrained weights did, if any

    # -- construction ------------------------------------------------------------------------
    def _make_heads(self, cfg: ViTConfig) -> None:
        self.head = self._make_head(cfg.num_classes)

    def _make_head(self, num_classes: int) -> nn.Module:
        return nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    @property
    def pos_embed_prefix_tokens(self) -> int:
        """How many prefix tokens have a position embedding: none with no_embed_class."""
        return 0 if self.config.no_embed_class else self.num_prefix_tokens

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's truncated normal(0.02) for every Linear, here the patch embedding's conv too
        (timm leaves it at PyTorch's default, std 1/sqrt(3 C p^2): 0.083 at patch 4), zero
        biases, and the ViT paper's zero head (timm's default head is trunc_normal(0.02)) so
        that training starts from uniform predictions; near-zero class and register tokens,
        LayerScale at init_values, the attention pool's query at std D**-0.5, a gated MLP's
        value at timm's start (`SwiGLUPacked.init_gate_`)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, LayerScale):
                nn.init.constant_(module.gamma, module.init_values)
        for module in self.modules():  # after the loop above, which visits fc1 after its MLP
            if isinstance(module, SwiGLUPacked):
                module.init_gate_()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        if self.attn_pool is not None:
            std = self.embed_dim**-0.5
            nn.init.trunc_normal_(self.attn_pool.latent, std=std, a=-2 * std, b=2 * std)
        self._zero_head()

    @torch.no_grad()
    def _zero_head(self) -> None:
        # A zero head predicts uniformly at first, so early gradients do not chase random logits.
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head(s) with fresh (zero) ones for `num_classes` (0 removes them).

        global_pool may switch between "token", "avg", "avgmax", "max" and "" (no pooling); a
        model built with
        an attention pool ("map") loses it when switched away, and cannot gain one.
        """
        if global_pool is not None:
            _check_pool(global_pool, self.cls_token is not None)
            if global_pool == "map" and self.attn_pool is None:
                raise ValueError("global_pool='map' cannot be added to a model built without it")
            if global_pool != "map":
                self.attn_pool = None
            self.global_pool = self.config.global_pool = global_pool
        device = self.pos_embed.device
        self.num_classes = self.config.num_classes = num_classes
        self.head = self._make_head(num_classes).to(device)
        self._zero_head()

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay should skip (the optimizer also skips biases/norms)."""
        names = ("pos_embed", "cls_token", "reg_token")
        return {name for name in names if getattr(self, name) is not None}

    def set_fused_attn(self, enabled: bool) -> None:
        """Switch every attention (blocks and attention pool) between fused SDPA (True) and the
        explicit softmax path."""
        for module in self.modules():
            if isinstance(module, (Attention, AttentionPoolLatent)):
                module.fused_attn = enabled

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of storing them:
        less memory for more compute (torch.utils.checkpoint), as timm's switch."""
        self.grad_checkpointing = enable

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.patch_embed.grid_size

    @property
    def pretrained_cfg(self) -> dict:
        """timm's `pretrained_cfg` dict (input_size (C, H, W), mean, std, interpolation,
        crop_pct, num_classes, ...) from `preprocess`, so timm's data helpers read it too."""
        return pretrained_cfg_of(self)

    # -- timm's attributes, read from the config: timm's own tools read this model as theirs
    # (its checkpoint_filter_fn counts prefix tokens by no_embed_class and has_class_token)
    @property
    def no_embed_class(self) -> bool:
        return self.config.no_embed_class

    @property
    def has_class_token(self) -> bool:
        return self.cls_token is not None

    @property
    def dynamic_img_size(self) -> bool:
        return self.patch_embed.dynamic_img_size

    @property
    def in_chans(self) -> int:
        return self.config.in_chans

    @property
    def head_hidden_size(self) -> int:
        return self.embed_dim

    @property
    def default_cfg(self) -> dict:
        return self.pretrained_cfg

    @property
    def patch_size(self) -> int | tuple[int, int]:
        """DINOv2's: pixels a patch spans, an int where square (14), else (height, width)."""
        height, width = self.patch_embed.patch_size
        return height if height == width else (height, width)

    @property
    def feature_info(self) -> list[dict]:
        """timm's: each block's output, its width and its reduction (input pixels a token: the
        longer side of a patch, an int as timm's `feat_ratio`)."""
        reduction = max(self.patch_embed.patch_size)
        return [
            dict(module=f"blocks.{i}", num_chs=self.embed_dim, reduction=reduction)
            for i in range(len(self.blocks))
        ]

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups, which its layer decay reads
        (`timm.optim.param_groups_layer_decay`, `create_optimizer_v2(layer_decay=...)`): the
        embeddings first, then each block, the final norm with the last block; what no pattern
        names (the pool, the heads) comes after them. `coarse` is timm's argument; a ViT's
        groups are the same either way."""
        return dict(
            stem=r"^cls_token|reg_token|dist_token|pos_embed|patch_embed|norm_pre",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """timm's: rebuild for another fixed input size, the position embeddings resampled
        once (`config.pos_embed_resample`'s way); `preprocess` follows the new size.

        A dynamic model whose weights come from a library that resamples its stored grid in
        every forward and has no set_input_size (transformers, the original DINOv2, torchvision:
        `pos_embed_resample` other than timm's) keeps that grid, and only its preprocessing
        takes the new size: resampled here once, every other size would be a resample of a
        resample, no longer that library's numbers. At the new size both give the same."""
        if (
            patch_size is not None
            and to_pair(patch_size, "patch_size") != self.patch_embed.patch_size
        ):
            raise ValueError(
                f"set_input_size cannot change patch_size {self.patch_embed.patch_size} (that "
                f"needs a resampled patch projection, FlexiViT's); give img_size only"
            )
        if img_size is None:
            return
        if self.dynamic_img_size and self.config.pos_embed_resample != "timm":
            size = to_pair(img_size, "img_size")
            self.patch_embed.grid_of(size)  # a size the patches tile, or ValueError
            if self.preprocess is not None:
                self.preprocess = replace(self.preprocess, input_size=size)
            return
        old_grid = self.grid_size
        self.patch_embed.set_input_size(img_size)
        pos_embed = self._resampled_pos_embed(self.pos_embed.detach(), self.grid_size, old_grid)
        self.pos_embed = nn.Parameter(pos_embed, requires_grad=self.pos_embed.requires_grad)
        self.config.img_size = self.patch_embed.img_size
        if self.preprocess is not None:
            self.preprocess = replace(self.preprocess, input_size=self.patch_embed.img_size)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's: drop the blocks after the last of `indices` (and the final norm, the head)
        that feature extraction does not use; returns the indices, counted from the start."""
        take = _take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max(take) + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "token" if self.config.distilled else "")
        return take

    # -- forward -----------------------------------------------------------------------------
    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Patch tokens (B, gh*gw, D) -> prefix tokens first, position embeddings added."""
        pos_embed = self.pos_embed  # (1, gh*gw + P or gh*gw, D) for the model's own grid
        # dynamic_img_size: another input size, or any where torch.export traces (asked first:
        # comparing the traced sizes would fix the program to the example's)
        resample = resamples_always(self.config.pos_embed_resample) or grid != self.grid_size
        if self.dynamic_img_size and resample:
            # Differentiable, so training at a smaller size still trains the full-size embeddings.
            pos_embed = self._resampled_pos_embed(pos_embed, grid, self.grid_size)
        tokens = self._prefix_tokens()
        if not tokens:  # SigLIP: no prefix tokens
            return self.pos_drop(x + pos_embed)
        prefix = torch.cat(tokens, dim=1).expand(x.shape[0], -1, -1)  # (B, P, D)
        if self.config.no_embed_class:  # DeiT III, DINOv2-reg: prefix tokens carry no position
            x = torch.cat([prefix, x + pos_embed], dim=1)  # (B, N, D)
        else:
            x = torch.cat([prefix, x], dim=1) + pos_embed  # (B, N, D)
        return self.pos_drop(x)

    def _resampled_pos_embed(
        self, pos_embed: torch.Tensor, grid: tuple[int, int], old_grid: tuple[int, int]
    ) -> torch.Tensor:
        """Position embeddings (1, P' + old gh*gw, D) -> (1, P' + gh*gw, D), resampled the way
        the weights' source library does (config.pos_embed_resample)."""
        return resample_pos_embed(
            pos_embed,
            grid,
            old_grid,
            num_prefix_tokens=self.pos_embed_prefix_tokens,
            method=self.config.pos_embed_resample,
        )

    def _prefix_tokens(self) -> list[nn.Parameter]:
        """The learned prefix tokens in order, each (1, t, D): class, registers."""
        return [t for t in (self.cls_token, self.reg_token) if t is not None]

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> tokens (B, N, D) ready for the first block."""
        grid = (
            x.shape[-2] // self.patch_embed.patch_size[0],
            x.shape[-1] // self.patch_embed.patch_size[1],
        )
        x = self.patch_embed(x)  # (B, gh*gw, D)
        x = self._pos_embed(x, grid)  # (B, N, D)
        x = self.patch_drop(x)  # (B, N', D), N' <= N in training only
        return self.norm_pre(x)  # CLIP normalises before the blocks

    def _run_block(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)

    def forward_features(
        self, x: torch.Tensor, return_dict: bool = False
    ) -> torch.Tensor | dict[str, torch.Tensor | None]:
        """Images (B, C, H, W) -> normalised tokens (B, N, D), prefix tokens first (timm's).

        return_dict: DINOv2's dict instead: `x_norm_clstoken` (B, D) (None without a class
        token), `x_norm_regtokens` (B, R, D), `x_norm_patchtokens` (B, gh*gw, D), `x_prenorm`
        (B, N, D) and `masks` (None: no masking here).
        In training with patch_drop_rate > 0, N counts only the kept patch tokens.
        """
        x = self._embed(x)
        for block in self.blocks:
            x = self._run_block(block, x)
        if not return_dict:
            return self.norm(x)
        x_norm, P = self.norm(x), self.num_prefix_tokens  # prefix: class, (dist,) registers
        return {
            "x_norm_clstoken": x_norm[:, 0] if self.cls_token is not None else None,
            "x_norm_regtokens": x_norm[:, P - self.num_reg_tokens : P],
            "x_norm_patchtokens": x_norm[:, P:],
            "x_prenorm": x,
            "masks": None,
        }

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | Sequence[int] = 1,
        reshape: bool = False,
        return_class_token: bool = False,
        norm: bool = True,
        *,
        return_prefix_tokens: bool = False,
    ) -> tuple:
        """DINOv2's: the outputs of the last n blocks (n an int) or of blocks n (a sequence),
        in block order, as patch tokens (B, gh*gw, D) without the prefix tokens, after the
        final norm if `norm`; (B, D, gh, gw) maps if `reshape`; each a pair (patch tokens,
        class token (B, D)) if `return_class_token`. A tuple, one item per block.
        timm's method of this name differs in its default, norm=False (give `norm` to get its
        numbers), and in `return_prefix_tokens`: each a pair (patch tokens, every prefix
        token (B, P, D): class, registers), taken here too."""
        if return_class_token and return_prefix_tokens:
            raise ValueError(
                "return_class_token (DINOv2's: the class token) and return_prefix_tokens (timm's:"
                " every prefix token) each ask for the tokens beside the patches; give one"
            )
        if return_class_token and self.cls_token is None:
            raise ValueError("return_class_token=True needs a model with a class token")
        outputs = self.forward_intermediates(
            x,
            indices=n,
            return_prefix_tokens=return_class_token or return_prefix_tokens,
            norm=norm,
            stop_early=True,
            output_fmt="NCHW" if reshape else "NLC",
            intermediates_only=True,
        )
        if return_class_token:  # the prefix (B, P, D) -> its class token (B, D)
            return tuple((patches, prefix[:, 0]) for patches, prefix in outputs)
        return tuple(outputs)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
    ) -> list | tuple[torch.Tensor, list] | dict:
        """Block outputs for dense tasks, timm's signature and semantics.

        indices: the last n blocks if an int, these blocks (negative from the end) if a list,
            every block if None. norm: apply the final norm to each. output_fmt: "NCHW" gives
            patch maps (B, D, gh, gw), "NLC" patch tokens (B, gh*gw, D); with
            return_prefix_tokens each is a pair (patches, prefix (B, P, D)).
        Returns the intermediates, or (forward_features output, intermediates); with
        output_dict, timm's dict of them: "image_intermediates", "image_intermediates_prefix"
        (with return_prefix_tokens, where the model has prefix tokens) and "image_features"
        (unless intermediates_only).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = _take_indices(len(self.blocks), indices)
        B, _, H, W = x.shape
        gh, gw = H // self.patch_embed.patch_size[0], W // self.patch_embed.patch_size[1]
        x = self._embed(x)
        intermediates = []
        last = max(take) if stop_early else len(self.blocks) - 1
        for i, block in enumerate(self.blocks[: last + 1]):
            x = self._run_block(block, x)
            if i in take:
                intermediates.append(self.norm(x) if norm else x)  # (B, N, D)
        P = self.num_prefix_tokens
        prefixes = [y[:, :P] for y in intermediates]  # (B, P, D)
        intermediates = [y[:, P:] for y in intermediates]  # (B, gh*gw, D)
        if output_fmt == "NCHW":
            intermediates = [
                y.reshape(B, gh, gw, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates
            ]  # (B, D, gh, gw)
        if output_dict:
            result = {"image_intermediates": intermediates}
            if return_prefix_tokens and P:
                result["image_intermediates_prefix"] = prefixes
            if not intermediates_only:
                result["image_features"] = self.norm(x)
            return result
        if return_prefix_tokens and P:
            intermediates = list(zip(intermediates, prefixes, strict=True))
        return intermediates if intermediates_only else (self.norm(x), intermediates)

    def pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
        """Tokens (B, N, D) -> pooled features (B, D) by the model's readout ("": unchanged), or
        by `pool_type` ("token", "avg", "avgmax", "max", "") where given, as timm's; an attention
        pool ("map") reads the tokens whatever is asked."""
        if self.attn_pool is not None:  # SigLIP: a learned query over the patch tokens
            return self.attn_pool(x[:, self.num_prefix_tokens :])  # (B, D)
        if pool_type is not None:
            _check_pool(pool_type, self.cls_token is not None)
            if pool_type == "map":
                raise ValueError("pool_type='map' needs a model built with global_pool='map'")
        pool_type = self.global_pool if pool_type is None else pool_type
        patches = x[:, self.num_prefix_tokens :]  # (B, gh*gw, D)
        if pool_type == "avg":
            return patches.mean(dim=1)  # (B, D)
        if pool_type == "max":
            return patches.amax(dim=1)  # (B, D)
        if pool_type == "avgmax":  # timm's order of operations: the same float32 values
            return 0.5 * (patches.amax(dim=1) + patches.mean(dim=1))  # (B, D)
        if pool_type == "token":
            return x[:, 0]  # the class token, (B, D)
        return x  # "": every token, (B, N, D)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens (B, N, D) -> logits (B, num_classes), or pooled features (B, D) if pre_logits.

        With global_pool="" nothing is pooled: every token is classified, (B, N, num_classes),
        or (B, N, D) if pre_logits. A headless model (num_classes=0) returns the features.
        """
        x = self.head_drop(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> forward_head's output: logits (B, num_classes), ..."""
        return self.forward_head(self.forward_features(x))


class VisionTransformerDistilled(VisionTransformer):
    """DeiT distilled (Touvron et al. 2021): a distillation token after the class token, read by
    its own head (`dist_token`, `head_dist`: timm's `VisionTransformerDistilled` names). The
    prediction is the mean of the two heads; in training after `set_distilled_training`, both
    logits, the second for the loss against a teacher's predictions."""

    def _make_heads(self, cfg: ViTConfig) -> None:
        super()._make_heads(cfg)
        # registered after pos_embed and head: timm's order of keys in the state dict
        self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.head_dist = self._make_head(cfg.num_classes)
        self.distilled_training = False

    @torch.no_grad()
    def init_weights(self) -> None:
        super().init_weights()
        nn.init.trunc_normal_(self.dist_token, std=0.02)  # timm's

    @torch.no_grad()
    def _zero_head(self) -> None:
        super()._zero_head()
        if isinstance(self.head_dist, nn.Linear):
            nn.init.zeros_(self.head_dist.weight)
            nn.init.zeros_(self.head_dist.bias)

    def _prefix_tokens(self) -> list[nn.Parameter]:
        return [self.cls_token, self.dist_token]  # (registers refused by _check_config)

    def get_classifier(self) -> tuple[nn.Module, nn.Module]:
        """(head, head_dist), as timm."""
        return self.head, self.head_dist

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, "token"):
            raise ValueError("a distilled model reads its class and distillation tokens")
        super().reset_classifier(num_classes)
        self.head_dist = self._make_head(num_classes).to(self.pos_embed.device)
        self._zero_head()

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"dist_token"}

    def set_distilled_training(self, enable: bool = True) -> None:
        """In training, return (class-head logits, distillation-head logits), as timm."""
        self.distilled_training = enable

    def forward_head(
        self, x: torch.Tensor, pre_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Tokens (B, N, D) -> the mean of both heads' logits (B, num_classes), or of the two
        tokens (B, D) if pre_logits; in distilled training, both logits, each (B, num_classes)."""
        cls, dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])  # each (B, D)
        if pre_logits:
            return (cls + dist) / 2
        cls, dist = self.head(cls), self.head_dist(dist)  # each (B, num_classes)
        if self.distilled_training and self.training:
            return cls, dist
        return (cls + dist) / 2


def model_class(config: ViTConfig | dict) -> type[VisionTransformer]:
    """The class that builds a model of this config (or of these `ViTConfig` arguments)."""
    distilled = config.get("distilled") if isinstance(config, dict) else config.distilled
    return VisionTransformerDistilled if distilled else VisionTransformer


# The architecture's numbers: (what they are, the values accepted). A value outside (e.g. a
# --model-kwargs typo) is refused naming its field, not met deep in the layers as a negative
# tensor size (mlp_ratio=-2), a division by zero (embed_dim=0) or a model of no blocks (depth=-1).
NUMBERS = {
    "embed_dim": ("token width", AT_LEAST_1),
    "depth": ("transformer blocks", AT_LEAST_1),
    "num_heads": ("attention heads", AT_LEAST_1),
    "mlp_ratio": ("MLP width / embed_dim", POSITIVE),
    "in_chans": ("image channels", AT_LEAST_1),
    "num_classes": ("classes of the head (0: no head)", AT_LEAST_0),
    "reg_tokens": ("register tokens", AT_LEAST_0),
    "norm_eps": ("LayerNorm epsilon", POSITIVE),
    **{
        f"{name}_rate": ("a fraction dropped", DROP_RATE)
        for name in ("drop", "pos_drop", "proj_drop", "attn_drop", "drop_path", "patch_drop")
    },
}


def _check_numbers(cfg: ViTConfig) -> None:
    """Refuse an architecture number of the wrong type or out of its range, naming its field."""
    for name, (what, accepted) in NUMBERS.items():
        value = getattr(cfg, name)
        kind = Integral if accepted.integer else Real
        if isinstance(value, bool) or not isinstance(value, kind) or value not in accepted:
            shown = value if isinstance(value, Real) else repr(value)
            raise ConfigValueError(out_of_range(name, shown, accepted, what), name)
    if cfg.embed_dim % cfg.num_heads:
        raise ConfigValueError(
            f"embed_dim {cfg.embed_dim} is not divisible by num_heads {cfg.num_heads}; "
            f"accepted: a multiple of num_heads (each head gets embed_dim / num_heads channels)",
            "embed_dim",
            "num_heads",
        )


def _check_config(cfg: ViTConfig) -> None:
    """Refuse numbers out of range and switch combinations the model cannot build, naming them."""
    _check_numbers(cfg)
    _check_pool(cfg.global_pool, cfg.class_token)
    if cfg.act_layer not in ACT_LAYERS:
        raise ValueError(f"act_layer must be one of {sorted(ACT_LAYERS)}, got {cfg.act_layer!r}")
    if cfg.mlp_layer not in MLP_LAYERS:
        raise ValueError(f"mlp_layer must be one of {sorted(MLP_LAYERS)}, got {cfg.mlp_layer!r}")
    hidden = int(cfg.embed_dim * cfg.mlp_ratio)
    if cfg.mlp_layer == "swiglu_packed" and hidden % 2:
        raise ConfigValueError(
            f"mlp_layer='swiglu_packed' splits its hidden width int(embed_dim * mlp_ratio) = "
            f"{hidden} into a gate and a value; accepted: an mlp_ratio that makes it even",
            "mlp_ratio",
        )
    if cfg.pos_embed_resample not in RESAMPLERS:
        raise ValueError(
            f"pos_embed_resample must be one of {sorted(RESAMPLERS)}, got "
            f"{cfg.pos_embed_resample!r}"
        )
    if cfg.distilled and (cfg.global_pool != "token" or cfg.reg_tokens):
        raise ValueError(
            "distilled=True reads the class and distillation tokens: it needs "
            "global_pool='token' and no register tokens"
        )


def _make_blocks(cfg: ViTConfig) -> nn.Sequential:
    """The `depth` transformer blocks; stochastic depth rises linearly from 0 at the first
    block to drop_path_rate at the last."""
    rates = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
    return nn.Sequential(
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
                init_values=cfg.init_values,
                act_layer=cfg.act_layer,
                mlp_layer=cfg.mlp_layer,
            )
            for rate in rates
        ]
    )


def _check_pool(global_pool: str, class_token: bool) -> None:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {global_pool!r}")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")


def _take_indices(depth: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's block selection: None every block, n the last n, a list those (negative: from
    the end). Out-of-range values are named."""
    if indices is None:
        indices = depth
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} of {depth} blocks")
        return list(range(depth - indices, depth))
    take = [depth + i if i < 0 else i for i in indices]
    bad = [i for i, t in zip(indices, take, strict=True) if not 0 <= t < depth]
    if bad or not take:
        raise ValueError(f"block indices {list(indices)} out of range for {depth} blocks")
    return take
