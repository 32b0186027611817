"""Hugging Face transformers' ViT (`ViTModel`, `ViTForImageClassification`) and MAE encoder
(`ViTMAEModel`, `ViTMAEForPreTraining`), read and written; and `config_to_hf` / `state_to_hf`,
which write any model as the transformers class of its family (`vit.models.families`).

transformers keeps q, k and v as three Linear layers; timm fuses them into one `qkv` whose
output rows are q's, then k's, then v's, so the three weights are stacked in that order.
Its files (the hub's and what `save_pretrained` writes) use the names below; transformers 5
renamed the modules in memory (`layers.{i}.attention.q_proj`, `mlp.fc1`, ...) and maps the
file names on load, so both spellings are read here. The architecture is otherwise the same
pre-norm ViT, except that its LayerNorm eps defaults to 1e-12 (timm: 1e-6). The MAE encoder is
this same ViT (its fixed sine-cosine position embeddings are stored like learned ones); the
pre-training decoder is dropped.

A folder (`config.json` + `model.safetensors` or `pytorch_model.bin`) also gives the
architecture, class names (`id2label`) and, from `preprocessor_config.json`, the preprocessing.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Collection, Mapping

import torch

from ...models import families
from ...models.vision_transformer import ViTConfig
from .hf_common import (
    backbone_config,
    backbone_to_hf,
    check_switches,
    convert,
    from_timm,
    labels_to_hf,
    prefixed,
)
from .keymap import KeyMap
from .refused import SUPPORTED

FILE_BLOCK, MEMORY_BLOCK = "encoder.layer.{i}.", "layers.{i}."
# the q, k and v Linear layers of a block as files name them (ViT, DeiT, DINOv2, MAE)
QKV_FILE = FILE_BLOCK + "attention.attention.{part}.{kind}"
QKV_PARTS = ("query", "key", "value")
BLOCK_PAIRS = [
    (FILE_BLOCK + "layernorm_before.", "blocks.{i}.norm1."),
    (FILE_BLOCK + "attention.output.dense.", "blocks.{i}.attn.proj."),
    (FILE_BLOCK + "layernorm_after.", "blocks.{i}.norm2."),
    (FILE_BLOCK + "intermediate.dense.", "blocks.{i}.mlp.fc1."),
    (FILE_BLOCK + "output.dense.", "blocks.{i}.mlp.fc2."),
    (MEMORY_BLOCK + "layernorm_before.", "blocks.{i}.norm1."),
    (MEMORY_BLOCK + "attention.o_proj.", "blocks.{i}.attn.proj."),
    (MEMORY_BLOCK + "layernorm_after.", "blocks.{i}.norm2."),
    (MEMORY_BLOCK + "mlp.fc1.", "blocks.{i}.mlp.fc1."),
    (MEMORY_BLOCK + "mlp.fc2.", "blocks.{i}.mlp.fc2."),
]
EMBEDDING_PAIRS = [
    ("embeddings.cls_token", "cls_token"),
    ("embeddings.position_embeddings", "pos_embed"),
    ("embeddings.patch_embeddings.projection.", "patch_embed.proj."),
]
KEYS = KeyMap([*EMBEDDING_PAIRS, *BLOCK_PAIRS, ("layernorm.", "norm.")])
# a q, k or v weight or bias of block `block`, in the file or the in-memory spelling
QKV_BODY = (
    r"(?:encoder\.layer|layers)\.(?P<block>\d+)\.attention\."
    r"(?:attention\.)?(?P<part>query|key|value|[qkv](?=_proj))(?:_proj)?\.(?P<kind>weight|bias)$"
)
PATCH_KEY = "embeddings.patch_embeddings.projection.weight"
MAE_DECODER_KEY = "decoder.decoder_embed.weight"
# tensors that exist in transformers' ViT but play no part in classification
IGNORED = {
    "pooler.dense.weight": "ViTModel's tanh pooler (classification reads the class token)",
    "pooler.dense.bias": None,
    "embeddings.mask_token": "the masked-image-modelling mask token (unused at inference)",
}
# model_type -> the classes whose weights are a plain ViT
ARCHITECTURES = {
    "vit": ("ViTModel", "ViTForImageClassification"),
    "vit_mae": ("ViTMAEModel", "ViTMAEForPreTraining"),
}


def matches(keys: Collection[str]) -> bool:
    return any(key.endswith(PATCH_KEY) for key in keys)


def _model_prefix(keys: Collection[str], source: str) -> str:
    """'' (a ViTModel) or 'vit.' (inside ViTForImageClassification); other models refused."""
    patch_key = next(key for key in keys if key.endswith(PATCH_KEY))
    prefix = patch_key[: -len(PATCH_KEY)]
    if prefix not in ("", "vit."):
        raise ValueError(
            f"{source} is a transformers '{prefix.rstrip('.')}' checkpoint, not a plain ViT; "
            f"supported: {SUPPORTED}"
        )
    return prefix


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """transformers names -> timm's: q, k, v fused into qkv; the pooler, the mask token and an
    MAE decoder dropped. Keys of anything else (layer scales, ...) mean another architecture:
    refused, naming them."""
    prefix = _model_prefix(list(state), source)
    notes = []
    if MAE_DECODER_KEY in state:  # ViTMAEForPreTraining: the encoder is a plain ViT
        state = {k: v for k, v in state.items() if not k.startswith("decoder.")}
        notes.append(f"{source}: ignored the MAE decoder (decoder.*, used in pre-training only)")
    keys = KeyMap([*prefixed(prefix, KEYS.pairs), ("classifier.", "head.")])
    ignored = {prefix + name: note for name, note in IGNORED.items()}
    out, more = convert(state, source, "plain ViT", keys, re.escape(prefix) + QKV_BODY, ignored)
    return out, notes + more


def write_state(state: Mapping[str, torch.Tensor], hf_class: str) -> dict[str, torch.Tensor]:
    """timm names -> those of `hf_class`'s files: "vit." and a `classifier` for
    ViTForImageClassification, bare for ViTModel and ViTMAEModel."""
    prefix = "vit." if hf_class == "ViTForImageClassification" else ""
    keys = KeyMap([*prefixed(prefix, KEYS.pairs), ("classifier.", "head.")])
    return from_timm(state, keys, prefix + QKV_FILE, QKV_PARTS, "ViT")


def config_from_hf(hf: dict, source: str) -> tuple[dict, list[str] | None]:
    """A transformers ViT or ViT-MAE `config.json` (as a dict) -> (our `ViTConfig` arguments
    without a head, None). The classifier and its class names are the weights' and id2label's
    (`hf_common.classifier_of`). Other ViT classes are refused, naming what they are."""
    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    accepted = ARCHITECTURES.get(model_type)
    if accepted is None:
        raise ValueError(
            f"{source} holds a transformers '{model_type}' model, not a plain ViT or ViT-MAE; "
            f"supported: {SUPPORTED}"
        )
    other = [a for a in architectures if a not in accepted]
    if other:
        raise ValueError(f"{source} holds a {other[0]}; supported: {SUPPORTED}")
    config = dict(
        backbone_config(hf, source),
        num_classes=0,  # a folder's classifier is sized by its weights: hf_common.classifier_of
        qkv_bias=bool(hf.get("qkv_bias", True)),
    )
    return config, None


def write_config(config: ViTConfig, hf_class: str, class_names: list[str] | None) -> dict:
    """Our config -> `hf_class`'s `config.json` (ViT or ViTMAE), or a ValueError naming what
    transformers' ViT cannot express."""
    why = "transformers' ViT reads the class token after the final LayerNorm"
    check_switches(config, "ViT", why, square=False)
    out = {
        "architectures": [hf_class],
        "model_type": "vit_mae" if hf_class == "ViTMAEModel" else "vit",
        **backbone_to_hf(config),
        "qkv_bias": config.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if hf_class == "ViTMAEModel":
        out["mask_ratio"] = 0.0  # the encoder sees every patch (MAE pre-training hid 75%)
    return out | labels_to_hf(class_names, config.num_classes)


# -- any family ----------------------------------------------------------------------------------
def _writer(config: ViTConfig, model_name: str | None):
    """(the family's transformers class, the layout module that writes it), or a ValueError."""
    family = families.family_of(config, model_name)
    hf_class = family.hf_class(config.num_classes)  # refuses what no class represents
    return hf_class, importlib.import_module(f"{__package__}.{family.hf_layout}")


def config_to_hf(
    config: ViTConfig, class_names: list[str] | None, model_name: str | None = None
) -> dict:
    """Our config -> the `config.json` of the transformers class its family is written as
    (`vit.models.families`: ViT, ViTMAEModel, Dinov2Model, Dinov2WithRegistersModel, CLIPVision*,
    SiglipVisionModel, DeiTForImageClassificationWithTeacher), or a one-line ValueError naming
    what no transformers class can hold. `model_name` tells an MAE encoder from a plain ViT."""
    hf_class, layout = _writer(config, model_name)
    return layout.write_config(config, hf_class.name, class_names)


def state_to_hf(
    state: Mapping[str, torch.Tensor], config: ViTConfig, model_name: str | None = None
) -> dict[str, torch.Tensor]:
    """Our (timm-named) state dict -> the tensors of the file `config_to_hf`'s class reads."""
    hf_class, layout = _writer(config, model_name)
    return layout.write_state(state, hf_class.name)
