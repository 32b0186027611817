"""Hugging Face transformers' ViT (`ViTModel`, `ViTForImageClassification`).

transformers keeps q, k and v as three Linear layers; timm fuses them into one `qkv` whose
output rows are q's, then k's, then v's, so the three weights are stacked in that order.
Its files (the hub's and what `save_pretrained` writes) use the names below; transformers 5
renamed the modules in memory (`layers.{i}.attention.q_proj`, `mlp.fc1`, ...) and maps the
file names on load, so both spellings are read here. The architecture is otherwise the same
pre-norm ViT, except that its LayerNorm eps defaults to 1e-12 (timm: 1e-6).

A folder (`config.json` + `model.safetensors` or `pytorch_model.bin`) also gives the
architecture, class names (`id2label`) and, from `preprocessor_config.json`, the preprocessing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path

import torch

from ..model import ViTConfig, to_pair
from .keymap import KeyMap

FILE_BLOCK, MEMORY_BLOCK = "encoder.layer.{i}.", "layers.{i}."
# q/k/v per block: (file spelling, transformers-5 in-memory spelling)
QKV = {
    "q": ("attention.attention.query.", "attention.q_proj."),
    "k": ("attention.attention.key.", "attention.k_proj."),
    "v": ("attention.attention.value.", "attention.v_proj."),
}
KEYS = KeyMap(
    [
        ("embeddings.cls_token", "cls_token"),
        ("embeddings.position_embeddings", "pos_embed"),
        ("embeddings.patch_embeddings.projection.", "patch_embed.proj."),
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
        ("layernorm.", "norm."),
    ]
)
_QKV_PATTERN = re.compile(
    r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.(query|key|value)|([qkv])_proj)"
    r"\.(weight|bias)$"
)
PATCH_KEY = "embeddings.patch_embeddings.projection.weight"
SUPPORTED = "plain ViT: ViTModel or ViTForImageClassification (model_type 'vit')"
# tensors that exist in transformers' ViT but play no part in classification
IGNORED = {
    "pooler.dense.weight": "ViTModel's tanh pooler (classification reads the class token)",
    "pooler.dense.bias": None,
    "embeddings.mask_token": "the masked-image-modelling mask token (unused at inference)",
}


def matches(keys: Collection[str]) -> bool:
    return any(key.endswith(PATCH_KEY) for key in keys)


def _model_prefix(keys: Collection[str], source: str) -> str:
    """'' (a ViTModel) or 'vit.' (inside ViTForImageClassification); other models refused."""
    patch_key = next(key for key in keys if key.endswith(PATCH_KEY))
    prefix = patch_key[: -len(PATCH_KEY)]
    if any("distillation_token" in key for key in keys):
        raise ValueError(
            f"{source} is a transformers DeiT with a distillation token (two prefix tokens and "
            f"two heads): not supported; supported: {SUPPORTED}"
        )
    if prefix not in ("", "vit."):
        raise ValueError(
            f"{source} is a transformers '{prefix.rstrip('.')}' checkpoint, not a plain ViT; "
            f"supported: {SUPPORTED}"
        )
    return prefix


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """transformers names -> timm's: q, k, v fused into qkv; the pooler and mask token dropped.

    Keys of anything else (a decoder, layer scales, ...) mean another architecture: refused,
    naming them."""
    prefix = _model_prefix(list(state), source)
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}  # (block, weight|bias) -> q/k/v
    notes, unknown = [], []
    for key, value in state.items():
        if key.startswith("classifier."):
            out["head." + key.removeprefix("classifier.")] = value
            continue
        name = key.removeprefix(prefix) if key.startswith(prefix) else None
        found = _QKV_PATTERN.match(name) if name else None
        if found:
            block, long_name, short_name, kind = found.groups()
            qkv.setdefault((int(block), kind), {})[(short_name or long_name[0])] = value
        elif name in IGNORED:
            if IGNORED[name]:
                notes.append(f"{source}: ignored {key}, {IGNORED[name]}")
        elif name is not None and KEYS.to_timm(name):
            out[KEYS.to_timm(name)] = value
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"{source} has tensors a plain ViT does not ({unknown[:8]}): another transformers "
            f"architecture; supported: {SUPPORTED}"
        )
    for (block, kind), parts in sorted(qkv.items()):
        if sorted(parts) != ["k", "q", "v"]:
            raise ValueError(f"{source}: block {block} has {kind} for {sorted(parts)} only")
        out[f"blocks.{block}.attn.qkv.{kind}"] = torch.cat([parts[p] for p in "qkv"])
    return out, notes


def from_timm(state: Mapping[str, torch.Tensor], with_head: bool) -> dict[str, torch.Tensor]:
    """timm names -> the names transformers' files use, with the "vit." prefix and a
    `classifier` for ViTForImageClassification (`with_head`), bare for ViTModel."""
    prefix = "vit." if with_head else ""
    out = {}
    for key, value in state.items():
        found = re.match(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", key)
        if found:
            block, kind = found.groups()
            for (long_name, _), part in zip(QKV.values(), value.chunk(3), strict=True):
                out[f"{prefix}{FILE_BLOCK.format(i=block)}{long_name}{kind}"] = part.contiguous()
        elif key.startswith("head."):
            if with_head:
                out["classifier." + key.removeprefix("head.")] = value
        elif KEYS.from_timm(key):
            out[prefix + KEYS.from_timm(key)] = value
        else:
            raise ValueError(f"{key} has no counterpart in transformers' ViT")
    return out


# -- config.json ---------------------------------------------------------------------------------
def config_from_hf(hf: dict, source: str) -> tuple[dict, list[str] | None]:
    """A transformers ViT `config.json` (as a dict) -> (our `ViTConfig` arguments, class names
    or None). Anything that is not a plain ViT is refused, naming what it is."""
    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    if model_type != "vit":
        listed = ", ".join(architectures) or "no architectures listed"
        raise ValueError(
            f"{source} holds a transformers '{model_type}' model ({listed}), not a plain ViT; "
            f"supported: {SUPPORTED}"
        )
    other = [a for a in architectures if a not in ("ViTModel", "ViTForImageClassification")]
    if other:
        raise ValueError(f"{source} holds a {other[0]}; supported: {SUPPORTED}")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(
            f"{source} uses hidden_act={hf['hidden_act']!r}; only 'gelu' (exact, erf-based, as "
            f"timm's ViT) is supported"
        )
    dim, heads = int(hf.get("hidden_size", 768)), int(hf.get("num_attention_heads", 12))
    intermediate = int(hf.get("intermediate_size", 3072))
    if int(dim * (intermediate / dim)) != intermediate:
        raise ValueError(
            f"{source}: intermediate_size {intermediate} is not expressible as a ratio"
        )
    classifier = "ViTForImageClassification" in architectures
    labels = hf.get("id2label") or {}
    class_names = [labels[k] for k in sorted(labels, key=int)] if classifier and labels else None
    num_classes = len(class_names) if class_names else int(hf.get("num_labels", 0) or 0)
    config = dict(
        img_size=to_pair(hf.get("image_size", 224), "image_size"),
        patch_size=to_pair(hf.get("patch_size", 16), "patch_size"),
        in_chans=int(hf.get("num_channels", 3)),
        num_classes=num_classes if classifier else 0,
        embed_dim=dim,
        depth=int(hf.get("num_hidden_layers", 12)),
        num_heads=heads,
        mlp_ratio=intermediate / dim,
        qkv_bias=bool(hf.get("qkv_bias", True)),
        norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
    )
    return config, class_names


def config_to_hf(config: ViTConfig, class_names: list[str] | None) -> dict:
    """Our config -> a transformers `config.json` dict, or a ValueError naming what transformers'
    ViT cannot express."""
    problems = [
        text
        for bad, text in (
            (config.global_pool != "token", f"global_pool={config.global_pool!r}"),
            (not config.class_token, "no class token"),
            (config.uses_fc_norm, "a LayerNorm after pooling (fc_norm)"),
        )
        if bad
    ]
    if problems:
        raise ValueError(
            "transformers' ViT cannot hold this model: it has "
            + ", ".join(problems)
            + "; transformers' ViT reads the class token after the final LayerNorm"
        )
    names = class_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    image, patch = to_pair(config.img_size, "img_size"), to_pair(config.patch_size, "patch_size")
    return {
        "architectures": ["ViTForImageClassification" if config.num_classes else "ViTModel"],
        "model_type": "vit",
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "hidden_act": "gelu",
        "layer_norm_eps": config.norm_eps,
        "image_size": image[0] if image[0] == image[1] else list(image),
        "patch_size": patch[0] if patch[0] == patch[1] else list(patch),
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


# -- preprocessor_config.json --------------------------------------------------------------------
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def preprocess_from_hf(processor: dict, img_size: tuple[int, int]) -> dict:
    """A `preprocessor_config.json` (ViTImageProcessor) -> `vit.Preprocess` fields.

    transformers resizes straight to `size`, we resize the shorter side and centre-crop
    (crop_pct 1.0): identical for square images, a crop instead of a squash otherwise."""
    size = processor.get("size") or {}
    height = size.get("height", size.get("shortest_edge", img_size[0]))
    width = size.get("width", size.get("shortest_edge", img_size[1]))
    return dict(
        input_size=(int(height), int(width)),
        mean=tuple(processor.get("image_mean", (0.5, 0.5, 0.5))),
        std=tuple(processor.get("image_std", (0.5, 0.5, 0.5))),
        interpolation=PIL_RESAMPLE.get(processor.get("resample", 2), "bilinear"),
        crop_pct=1.0,
    )


def preprocess_to_hf(preprocess) -> dict:
    """Our `Preprocess` -> a ViTImageProcessor `preprocessor_config.json` dict."""
    resample = {name: code for code, name in PIL_RESAMPLE.items()}
    height, width = preprocess.input_size
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": height, "width": width},
        "resample": resample.get(preprocess.interpolation, 3),
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(preprocess.mean),
        "image_std": list(preprocess.std),
    }


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e


def weights_files(folder: Path) -> list[Path]:
    """The weights files of a transformers folder: one file, or the shards of an index."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
        index = folder / f"{name}.index.json"
        if index.is_file():
            shards = sorted(set(read_json(index).get("weight_map", {}).values()))
            return [folder / shard for shard in shards]
    raise FileNotFoundError(
        f"{folder} has a config.json but no weights: expected model.safetensors or "
        f"pytorch_model.bin (or a sharded *.index.json)"
    )
