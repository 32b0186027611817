"""torchvision's `VisionTransformer` (`vit_b_16`, `vit_b_32`, `vit_l_16`, `vit_l_32`, `vit_h_14`).

The architecture is the same as timm's, LayerNorm eps 1e-6 included, and `nn.MultiheadAttention`
keeps q, k and v stacked in one `in_proj_weight` in timm's order, so the map is renames only.
What torchvision can build and we cannot: a tanh "pre-logits" representation layer and a
convolutional stem; both are refused by name.

torchvision's model never resamples by itself; its helper `interpolate_embeddings` (used to
fine-tune at another size) is bicubic with align_corners=True, and a torchvision file loaded at
another size is resampled that way (`vit.models.pos_embed`, method "torchvision"): the same
numbers as that helper's state dict in torchvision's model at the new size.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from ...models import families
from ...models.vision_transformer import ViTConfig, to_pair
from .keymap import KeyMap

BLOCK = "encoder.layers.encoder_layer_{i}."
KEYS = KeyMap(
    [
        ("class_token", "cls_token"),
        ("conv_proj.", "patch_embed.proj."),
        ("encoder.pos_embedding", "pos_embed"),
        (BLOCK + "ln_1.", "blocks.{i}.norm1."),
        (BLOCK + "self_attention.in_proj_weight", "blocks.{i}.attn.qkv.weight"),
        (BLOCK + "self_attention.in_proj_bias", "blocks.{i}.attn.qkv.bias"),
        (BLOCK + "self_attention.out_proj.", "blocks.{i}.attn.proj."),
        (BLOCK + "ln_2.", "blocks.{i}.norm2."),
        (BLOCK + "mlp.0.", "blocks.{i}.mlp.fc1."),
        (BLOCK + "mlp.3.", "blocks.{i}.mlp.fc2."),
        (BLOCK + "mlp.linear_1.", "blocks.{i}.mlp.fc1."),  # torchvision < 0.13 checkpoints
        (BLOCK + "mlp.linear_2.", "blocks.{i}.mlp.fc2."),
        ("encoder.ln.", "norm."),
        ("heads.head.", "head."),
    ]
)
# name: (patch_size, depth, num_heads, embed_dim, mlp_dim), as torchvision's builders set them
BUILDERS = {
    "vit_b_16": (16, 12, 12, 768, 3072),
    "vit_b_32": (32, 12, 12, 768, 3072),
    "vit_l_16": (16, 24, 16, 1024, 4096),
    "vit_l_32": (32, 24, 16, 1024, 4096),
    "vit_h_14": (14, 32, 16, 1280, 5120),
}


def matches(keys: Collection[str]) -> bool:
    return any(
        key.startswith(("conv_proj.", "encoder.pos_embedding", "encoder.layers.encoder_layer_"))
        for key in keys
    )


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """torchvision names -> timm's. Unknown keys keep their names (load_weights names them)."""
    if any(key.startswith("heads.pre_logits") for key in state):
        raise ValueError(
            f"{source} is a torchvision ViT with a representation layer (heads.pre_logits, "
            f"built with representation_size=...): not supported, only the plain "
            f"vit_b_16/vit_b_32/vit_l_16/vit_l_32/vit_h_14 layout with one linear head is"
        )
    if any(key.startswith("conv_proj.") and key.count(".") > 1 for key in state):
        raise ValueError(
            f"{source} is a torchvision ViT with a convolutional stem (conv_stem_configs): not "
            f"supported, only the plain patchify convolution (conv_proj.weight) is"
        )
    return {KEYS.to_timm(key) or key: value for key, value in state.items()}, []


def from_timm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm names -> torchvision's (every key must have a counterpart)."""
    out = {}
    for key, value in state.items():
        theirs = KEYS.from_timm(key)
        if theirs is None:
            raise ValueError(f"{key} has no counterpart in torchvision's VisionTransformer")
        out[theirs] = value
    return out


def constructor_args(config: ViTConfig) -> tuple[str | None, dict]:
    """(torchvision builder name or None, keyword arguments of `VisionTransformer(...)`) for a
    model of this config, or a ValueError naming what torchvision's ViT cannot express."""
    image, patch = to_pair(config.img_size, "img_size"), to_pair(config.patch_size, "patch_size")
    mlp_dim = int(config.embed_dim * config.mlp_ratio)
    problems = [
        text
        for bad, text in (
            (image[0] != image[1], f"a non-square image size {image}"),
            (patch[0] != patch[1], f"a non-square patch size {patch}"),
            (image[0] % patch[0], f"{image[0]}-px images its {patch[0]}-px patches do not tile"),
            (config.global_pool != "token", f"global_pool={config.global_pool!r}"),
            (not config.class_token, "no class token"),
            (config.uses_fc_norm, "a LayerNorm after pooling (fc_norm)"),
            (not config.qkv_bias, "qkv_bias=False"),
            (config.in_chans != 3, f"in_chans={config.in_chans}"),
            (config.norm_eps != 1e-6, f"norm_eps={config.norm_eps} (torchvision's is 1e-6)"),
            (config.num_classes < 1, "no classifier head (num_classes=0)"),
        )
        if bad
    ]
    problems += families.extra_switches(config)  # those of another family: LayerScale, ...
    if problems:
        raise ValueError(
            "torchvision's VisionTransformer cannot hold this model: it has "
            + ", ".join(problems)
            + "; torchvision's ViT is a plain ViT: square, tiled by its patches, class-token "
            "pooled, with qkv bias, 3 input channels, exact GELU, LayerNorm eps 1e-6 and a linear "
            "head"
        )
    kwargs = dict(
        image_size=image[0],
        patch_size=patch[0],
        num_layers=config.depth,
        num_heads=config.num_heads,
        hidden_dim=config.embed_dim,
        mlp_dim=mlp_dim,
        num_classes=config.num_classes,
    )
    shape = (patch[0], config.depth, config.num_heads, config.embed_dim, mlp_dim)
    builder = next((name for name, sizes in BUILDERS.items() if sizes == shape), None)
    return builder, kwargs


def preprocess_for(input_size: tuple[int, int], patch_size: tuple[int, int]) -> dict:
    """`vit.Preprocess` fields for torchvision's ViT weights at this input size.

    Its 224x224 V1 weights (IMAGENET1K_V1 of vit_b_16/b_32/l_16/l_32) resize the shorter side to
    256 (bilinear) and crop 224; its SWAG weights resize bicubic straight to the input size
    (384, 512, 518, and 224 for IMAGENET1K_SWAG_LINEAR_V1). vit_h_14 (the patch-14 model) has
    SWAG weights only, so it always gets SWAG's; a 224-px b_16/l_16 file is taken as V1 (the
    tensors do not say which of the two it is)."""
    v1 = tuple(input_size) == (224, 224) and tuple(patch_size) != (14, 14)
    return dict(
        input_size=tuple(input_size),
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        interpolation="bilinear" if v1 else "bicubic",
        crop_pct=224 / 256 if v1 else 1.0,
    )
