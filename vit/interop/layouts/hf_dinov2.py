"""transformers' DINOv2 (`Dinov2Model`) and DINOv2 with registers (`Dinov2WithRegistersModel`).

A pre-norm ViT with LayerScale (`layer_scale1.lambda1` -> timm's `ls1.gamma`) and, with
registers, `register_tokens` after the class token. q, k and v are fused as for the plain ViT.
transformers adds the class token's position embedding before inserting the registers; timm's
no_embed_class layout keeps position embeddings for the patches only, so that one embedding is
folded into the class token (exact: the class position is never resampled), as timm's own
DINOv2 conversion does.

Position embeddings are stored for 518 px (37x37 patches) and resampled to the input in every
forward: plain DINOv2 bicubic without antialiasing, DINOv2 with registers bicubic with it
(timm's). Loading records which, so a model built at 224 px gives transformers' numbers.

ViT-g/14's gated MLP (`use_swiglu_ffn`) is stored as `mlp.weights_in` (the gate's rows, then the
value's) and `mlp.weights_out`, timm's `SwiGLUPacked` `mlp.fc1` and `mlp.fc2`; transformers 5
splits `weights_in` in memory into `gate_proj` and `up_proj`, which are packed again on reading.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping

import torch

from ...models.vision_transformer import holds_gated_mlp
from . import hf_common as hf
from . import huggingface as vit_layout
from .keymap import KeyMap
from .refused import SUPPORTED

BLOCK = "encoder.layer.{i}."
KEYS = KeyMap(
    [
        *vit_layout.EMBEDDING_PAIRS,
        ("embeddings.register_tokens", "reg_token"),
        (BLOCK + "norm1.", "blocks.{i}.norm1."),
        (BLOCK + "attention.output.dense.", "blocks.{i}.attn.proj."),
        (BLOCK + "attention.o_proj.", "blocks.{i}.attn.proj."),  # transformers 5, in memory
        (BLOCK + "layer_scale1.lambda1", "blocks.{i}.ls1.gamma"),
        (BLOCK + "norm2.", "blocks.{i}.norm2."),
        (BLOCK + "mlp.fc1.", "blocks.{i}.mlp.fc1."),
        (BLOCK + "mlp.fc2.", "blocks.{i}.mlp.fc2."),
        (BLOCK + "layer_scale2.lambda1", "blocks.{i}.ls2.gamma"),
        ("layernorm.", "norm."),
    ]
)
# ViT-g/14's gated MLP, the file's names first: those are what `write_state` writes
SWIGLU_PAIRS = [
    (BLOCK + "mlp.weights_in.", "blocks.{i}.mlp.fc1."),
    (BLOCK + "mlp.weights_out.", "blocks.{i}.mlp.fc2."),
]
READ_KEYS = KeyMap([*KEYS.pairs, *SWIGLU_PAIRS])
SWIGLU_KEYS = KeyMap([*SWIGLU_PAIRS, *KEYS.pairs])
# transformers 5's in-memory halves of weights_in (gate first) and its weights_out
IN_MEMORY_SWIGLU = re.compile(
    r"^(?P<mlp>.*\.mlp\.)(?P<part>gate|up|down)_proj\.(?P<kind>weight|bias)$"
)
IGNORED = {"embeddings.mask_token": "DINOv2's masked-patch token (used in training only)"}
# transformers' Dinov2Config defaults (intermediate_size is not used: mlp_ratio is)
DEFAULTS = {**hf.DEFAULTS, "patch_size": 14, "layer_norm_eps": 1e-6}
ARCHITECTURES = ("Dinov2Model", "Dinov2WithRegistersModel")


def matches(keys: Collection[str]) -> bool:
    return any(re.search(r"(^|\.)encoder\.layer\.\d+\.layer_scale1\.lambda1$", k) for k in keys)


def has_registers(keys: Collection[str]) -> bool:
    return any(key.endswith("embeddings.register_tokens") for key in keys)


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """transformers' DINOv2 names -> timm's; registers in timm's no_embed_class layout."""
    if any(key.startswith("dinov2.") or key.startswith("classifier.") for key in state):
        raise ValueError(
            f"{source} is a transformers Dinov2ForImageClassification, whose classifier reads "
            f"the class token and the mean patch token together: not supported; supported: "
            f"{SUPPORTED}"
        )
    state = pack_swiglu(state)
    out, notes = hf.convert(state, source, "DINOv2", READ_KEYS, vit_layout.QKV_BODY, IGNORED)
    if "reg_token" in out:
        notes.append(f"{source}: {fold_class_position(out)}")
    return out, notes


def pack_swiglu(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's in-memory gated MLP (`gate_proj`, `up_proj`, `down_proj`) -> its
    file's `weights_in` (the gate's rows, then the value's) and `weights_out`."""
    out, halves = {}, {}
    for key, value in state.items():
        found = IN_MEMORY_SWIGLU.match(key)
        if not found:
            out[key] = value
        elif found["part"] == "down":
            out[f"{found['mlp']}weights_out.{found['kind']}"] = value
        else:
            packed = f"{found['mlp']}weights_in.{found['kind']}"
            halves.setdefault(packed, {})[found["part"]] = value
    for key, parts in halves.items():
        if sorted(parts) != ["gate", "up"]:
            raise ValueError(f"{key} has {sorted(parts)} only of gate_proj and up_proj")
        out[key] = torch.cat([parts["gate"], parts["up"]])  # (2 * hidden, D) or (2 * hidden,)
    return out


def fold_class_position(out: dict[str, torch.Tensor]) -> str:
    """DINOv2 with registers -> timm's no_embed_class layout, in place: the class token's
    position embedding is added to the class token and dropped from `pos_embed`."""
    pos = out["pos_embed"]  # (1, 1 + gh*gw, D)
    out["cls_token"] = out["cls_token"] + pos[:, :1]
    out["pos_embed"] = pos[:, 1:]  # (1, gh*gw, D)
    return "folded the class token's position embedding into cls_token (no_embed_class)"


def config_from_hf(hf_config: dict, source: str) -> tuple[dict, None]:
    """A transformers DINOv2 `config.json` -> our `ViTConfig` arguments (a headless backbone:
    num_classes=0, model(x) is the class token after the final norm, Dinov2Model's
    pooler_output)."""
    architectures = hf_config.get("architectures") or []
    other = [a for a in architectures if a not in ARCHITECTURES]
    if other:
        raise ValueError(f"{source} holds a {other[0]}; supported: {SUPPORTED}")
    config = hf.backbone_config(hf_config, source, DEFAULTS)
    registers = int(hf_config.get("num_register_tokens", 4))  # Dinov2WithRegistersConfig default
    mlp_ratio = float(hf_config.get("mlp_ratio", 4))  # DINOv2 ignores intermediate_size
    config.update(
        num_classes=0,
        mlp_ratio=mlp_ratio,
        qkv_bias=bool(hf_config.get("qkv_bias", True)),
        init_values=float(hf_config.get("layerscale_value", 1.0)),
    )
    if hf_config.get("use_swiglu_ffn"):  # hidden_act is not used: the gate is a SiLU
        dim = config["embed_dim"]
        packed = 2 * swiglu_width(dim, mlp_ratio)  # fc1's rows: the gate's and the value's
        config.update(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=ratio_of(dim, packed))
    if hf_config.get("model_type") == "dinov2_with_registers":
        config.update(reg_tokens=registers, no_embed_class=True)
    return config, None


def swiglu_width(dim: int, mlp_ratio: float) -> int:
    """The gated MLP's width in DINOv2 (its code and transformers'): two thirds of the plain
    MLP's, rounded up to a multiple of 8 (4096 for ViT-g/14: 1536 x 4 x 2/3)."""
    return (int(int(dim * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def ratio_of(dim: int, hidden: int) -> float:
    """An mlp_ratio whose int(dim * mlp_ratio) is `hidden`, as the model computes its width."""
    ratio = hidden / dim
    return ratio if int(dim * ratio) == hidden else math.nextafter(ratio, math.inf)


def write_state(state: Mapping[str, torch.Tensor], hf_class: str) -> dict[str, torch.Tensor]:
    """timm names -> Dinov2Model's or Dinov2WithRegistersModel's. With registers the class
    token's position embedding, folded into the class token on reading, is written as zero:
    transformers adds it to the class token, which then equals ours. A gated MLP (fc1 twice
    as wide as fc2's input: the gate and the value) is written as weights_in and weights_out."""
    keys = SWIGLU_KEYS if holds_gated_mlp(state) else KEYS
    out = hf.from_timm(state, keys, vit_layout.QKV_FILE, vit_layout.QKV_PARTS, hf_class)
    pos = out["embeddings.position_embeddings"]  # (1, gh*gw or 1 + gh*gw, D)
    if "embeddings.register_tokens" in out:
        out["embeddings.position_embeddings"] = torch.cat([torch.zeros_like(pos[:, :1]), pos], 1)
    out["embeddings.mask_token"] = torch.zeros(1, pos.shape[-1])  # used in training only
    return out


def write_config(config, hf_class: str, class_names: list[str] | None) -> dict:
    """Our DINOv2 config -> Dinov2Model's or Dinov2WithRegistersModel's `config.json`."""
    registers = hf_class == "Dinov2WithRegistersModel"
    why = "transformers' DINOv2 has LayerScale and reads the class token after the final norm"
    expected = dict(reg_tokens=hf.ANY, no_embed_class=True) if registers else {}
    hf.check_switches(config, "DINOv2", why, init_values=hf.ANY, mlp_layer=hf.ANY, **expected)
    swiglu = config.mlp_layer == "swiglu_packed"
    mlp_ratio = hf_mlp_ratio(config) if swiglu else config.mlp_ratio
    if mlp_ratio != int(mlp_ratio):
        raise ValueError(
            f"transformers' DINOv2 cannot hold this model: its mlp_ratio {config.mlp_ratio} is "
            f"not a whole number"
        )
    out = {
        "architectures": [hf_class],
        "model_type": "dinov2_with_registers" if registers else "dinov2",
        **hf.backbone_to_hf(config),
        "mlp_ratio": int(mlp_ratio),
        "layerscale_value": config.init_values,
        "qkv_bias": config.qkv_bias,
        "use_swiglu_ffn": swiglu,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "drop_path_rate": 0.0,
    }
    if registers:
        out["num_register_tokens"] = config.reg_tokens
    return out


def hf_mlp_ratio(config) -> int:
    """The whole-number mlp_ratio from which transformers' DINOv2 derives a gated MLP of this
    model's width (`swiglu_width`), or a ValueError: transformers' gate is always a SiLU."""
    width = int(config.embed_dim * config.mlp_ratio) // 2
    if config.act_layer != "silu":
        raise ValueError(
            f"transformers' DINOv2 cannot hold this model: its gated MLP's gate is a SiLU, "
            f"this model's act_layer is {config.act_layer!r}"
        )
    ratio = next((r for r in range(1, 17) if swiglu_width(config.embed_dim, r) == width), None)
    if ratio is None:
        raise ValueError(
            f"transformers' DINOv2 cannot hold this model: no whole mlp_ratio gives its gated "
            f"MLP's width {width} (two thirds of embed_dim x mlp_ratio, rounded up to 8)"
        )
    return ratio


# transformers' Dinov2Model (and with registers) resamples its position embeddings to the input
# in every forward: any size that is a multiple of the patch size runs, as with
# dynamic_img_size=True, which `vit.load_model` sets for these folders.
MODEL_TYPES = ("dinov2", "dinov2_with_registers")
# The preprocessing of a folder saved without preprocessor_config.json: DINOv2's own evaluation
# transform, as the published folders' BitImageProcessor spells it (shorter side to 256,
# bicubic, centre crop 224, ImageNet statistics), not the 518 px of config.json's image_size
# (the grid the position embeddings are stored at).
PREPROCESSOR = {
    "size": {"shortest_edge": 256},
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "resample": 3,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}


def default_processor(img_size: tuple[int, int]) -> dict:
    """PREPROCESSOR, whatever the stored grid's size."""
    return PREPROCESSOR
