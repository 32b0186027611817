"""Hugging Face transformers' ViT (`ViTModel`, `ViTForImageClassification`) and MAE encoder
(`ViTMAEModel`, `ViTMAEForPreTraining`), and what every transformers layout here shares.

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

import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path

import torch

from ..model import ViTConfig, to_pair
from .keymap import KeyMap, rename
from .refused import SUPPORTED

FILE_BLOCK, MEMORY_BLOCK = "encoder.layer.{i}.", "layers.{i}."
# q/k/v per block: (file spelling, transformers-5 in-memory spelling)
QKV = {
    "q": ("attention.attention.query.", "attention.q_proj."),
    "k": ("attention.attention.key.", "attention.k_proj."),
    "v": ("attention.attention.value.", "attention.v_proj."),
}
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
# transformers' hidden_act -> our act_layer
ACT_LAYERS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "quick_gelu": "quick_gelu",
}


def prefixed(prefix: str, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(prefix + theirs, ours) for theirs, ours in pairs]


def convert(
    state: Mapping[str, torch.Tensor],
    source: str,
    what: str,
    keys: KeyMap,
    qkv: str,
    ignored: Mapping[str, str | None],
) -> tuple[dict, list[str]]:
    """Rename a transformers state dict by `keys`, fusing q/k/v (matched by the regex `qkv`),
    dropping `ignored` and refusing any other key, naming it: another architecture."""
    out, notes, unknown = rename(state, keys, re.compile(qkv), ignored)
    if unknown:
        raise ValueError(
            f"{source} has tensors a {what} does not ({unknown[:8]}): another architecture; "
            f"supported: {SUPPORTED}"
        )
    return out, [f"{source}: {note}" for note in notes]


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
def act_layer(hf: dict, source: str) -> str:
    """transformers' `hidden_act` -> our `act_layer`, or a ValueError naming what is accepted."""
    act = hf["hidden_act"]
    if act not in ACT_LAYERS:
        raise ValueError(
            f"{source} uses hidden_act={act!r}; accepted: {sorted(ACT_LAYERS)} (exact GELU, "
            f"tanh-approximated GELU, QuickGELU)"
        )
    return ACT_LAYERS[act]


# transformers' ViTConfig defaults: a config.json may leave out what equals them
DEFAULTS = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    image_size=224,
    patch_size=16,
    num_channels=3,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
)


def backbone_config(hf: dict, source: str, defaults: dict = DEFAULTS) -> dict:
    """The `ViTConfig` fields every transformers ViT-like config states the same way, with the
    family's defaults for what `hf` leaves out."""
    hf = {**defaults, **hf}
    dim = int(hf["hidden_size"])
    return dict(
        img_size=to_pair(hf["image_size"], "image_size"),
        patch_size=to_pair(hf["patch_size"], "patch_size"),
        in_chans=int(hf["num_channels"]),
        embed_dim=dim,
        depth=int(hf["num_hidden_layers"]),
        num_heads=int(hf["num_attention_heads"]),
        mlp_ratio=int(hf["intermediate_size"]) / dim,
        norm_eps=float(hf["layer_norm_eps"]),
        act_layer=act_layer(hf, source),
    )


def class_names_of(hf: dict) -> list[str] | None:
    labels = hf.get("id2label") or {}
    return [labels[k] for k in sorted(labels, key=int)] if labels else None


def config_from_hf(hf: dict, source: str) -> tuple[dict, list[str] | None]:
    """A transformers ViT or ViT-MAE `config.json` (as a dict) -> (our `ViTConfig` arguments,
    class names or None). Other ViT classes are refused, naming what they are."""
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
    classifier = "ViTForImageClassification" in architectures
    class_names = class_names_of(hf) if classifier else None
    num_classes = len(class_names) if class_names else int(hf.get("num_labels", 0) or 0)
    config = dict(
        backbone_config(hf, source),
        num_classes=num_classes if classifier else 0,
        qkv_bias=bool(hf.get("qkv_bias", True)),
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
    """A `preprocessor_config.json` -> `vit.Preprocess` fields.

    ViTImageProcessor (and SigLIP's) resizes straight to `size`: we resize the shorter side and
    centre-crop (crop_pct 1.0), identical for square images, a crop instead of a squash
    otherwise. CLIP's and DINOv2's processors resize the shorter side to `size` and centre-crop
    `crop_size`, which is crop_pct = crop / shorter side (DINOv2: 224 / 256)."""
    size, crop = processor.get("size") or {}, processor.get("crop_size") or {}
    if isinstance(size, int):  # older processors: one number, the shorter side
        size = {"shortest_edge": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    height = size.get("height", size.get("shortest_edge", img_size[0]))
    width = size.get("width", size.get("shortest_edge", img_size[1]))
    crop_pct = 1.0
    if processor.get("do_center_crop") and "shortest_edge" in size and crop:
        crop_pct = crop["height"] / size["shortest_edge"]
        height, width = crop["height"], crop["width"]
    return dict(
        input_size=(int(height), int(width)),
        mean=tuple(processor.get("image_mean", (0.5, 0.5, 0.5))),
        std=tuple(processor.get("image_std", (0.5, 0.5, 0.5))),
        interpolation=PIL_RESAMPLE.get(processor.get("resample", 2), "bilinear"),
        crop_pct=crop_pct,
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
