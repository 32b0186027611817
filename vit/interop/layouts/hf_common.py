"""What every transformers layout here shares: renaming a state dict both ways (q, k and v
fused into timm's qkv on reading, split on writing), the `config.json` fields every ViT-like
transformers config states alike, `preprocessor_config.json`, and finding a folder's files.

The layouts themselves are `huggingface` (ViT, MAE), `hf_deit`, `hf_dinov2`, `hf_clip` and
`hf_siglip`; `vit.models.families` says which family each reads and writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from ...models import families
from ...models.vision_transformer import ViTConfig, to_pair
from .keymap import KeyMap, rename
from .refused import SUPPORTED

# transformers' hidden_act -> our act_layer
ACT_LAYERS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
}
# our act_layer -> the hidden_act transformers' configs write for it
HIDDEN_ACTS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_pytorch_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
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


ANY = object()  # in check_switches: any true value (e.g. LayerScale's init_values)
# timm's fused qkv, split into transformers' three Linear layers on writing
QKV_KEY = re.compile(r"^blocks\.(?P<block>\d+)\.attn\.qkv\.(?P<kind>weight|bias)$")


def from_timm(
    state: Mapping[str, torch.Tensor],
    keys: KeyMap,
    qkv: str,
    parts: tuple[str, str, str],
    what: str,
) -> dict[str, torch.Tensor]:
    """timm names -> a transformers file's by `keys`, each block's qkv split into the q, k and v
    Linear layers named by the template `qkv` (`{i}` the block, `{part}` one of `parts`, `{kind}`
    weight or bias). A tensor without a counterpart raises a ValueError naming it."""
    out = {}
    for key, value in state.items():
        found = QKV_KEY.match(key)
        if found:
            for part, chunk in zip(parts, value.chunk(3), strict=True):  # q's rows, k's, v's
                name = qkv.format(i=found["block"], part=part, kind=found["kind"])
                out[name] = chunk.contiguous()
        elif keys.from_timm(key) is not None:
            out[keys.from_timm(key)] = value
        else:
            raise ValueError(f"{key} has no counterpart in transformers' {what}")
    return out


# -- config.json ---------------------------------------------------------------------------------
def act_layer(hf: dict, source: str) -> str:
    """transformers' `hidden_act` -> our `act_layer`, or a ValueError naming what is accepted."""
    act = hf["hidden_act"]
    if act not in ACT_LAYERS:
        raise ValueError(
            f"{source} uses hidden_act={act!r}; accepted: {sorted(ACT_LAYERS)} (exact GELU, "
            f"tanh-approximated GELU, QuickGELU, SiLU)"
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


def class_names_of(hf: dict, num_classes: int, source: str) -> list[str] | None:
    """`id2label` -> the name of each of the `num_classes` outputs, by id (None without a head
    or an id2label). Ids outside 0..num_classes-1, or outputs without a name, are refused:
    counting the names would shift every one after a gap onto another output (transformers
    refuses a folder whose id2label count differs from its classifier's rows)."""
    labels = {int(k): name for k, name in (hf.get("id2label") or {}).items()}
    if not num_classes or not labels:
        return None
    outside = sorted(set(labels) - set(range(num_classes)))
    missing = sorted(set(range(num_classes)) - set(labels))
    problems = []
    if outside:
        problems.append(f"ids {outside} outside them")
    if missing:
        problems.append(f"no name for {missing}")
    if problems:
        raise ValueError(
            f"{source}: config.json's id2label does not name the classifier's {num_classes} "
            f"outputs 0..{num_classes - 1} ({'; '.join(problems)})"
        )
    return [labels[i] for i in range(num_classes)]


def classifier_of(
    hf: dict, state: Mapping[str, torch.Tensor], source: str
) -> tuple[int, list[str] | None]:
    """(num_classes, class names) of a ViT or DeiT folder whose tensors, under timm's names,
    are `state`: the classifier's rows, as transformers builds it from the weights, not
    config.json's `architectures` (may be absent) or the count of `id2label` (may have gaps);
    0 without a classifier tensor (ViTModel)."""
    head = state.get("head.weight")
    num_classes = 0 if head is None else head.shape[0]
    return num_classes, class_names_of(hf, num_classes, source)


def backbone_to_hf(config: ViTConfig) -> dict:
    """The `config.json` fields every transformers ViT-like config states the same way (the
    inverse of `backbone_config`); square images and patches only."""
    image, patch = to_pair(config.img_size, "img_size"), to_pair(config.patch_size, "patch_size")
    return {
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "hidden_act": HIDDEN_ACTS[config.act_layer],
        "layer_norm_eps": config.norm_eps,
        "image_size": image[0] if image[0] == image[1] else list(image),
        "patch_size": patch[0] if patch[0] == patch[1] else list(patch),
        "num_channels": config.in_chans,
    }


def check_switches(config: ViTConfig, what: str, why: str, square: bool = True, **expected) -> None:
    """Refuse, in one ValueError line, a config that transformers' `what` cannot hold: family
    switches other than `expected` (the plain ViT's otherwise; any activation is fine), a
    readout other than the class token after the final norm, a non-square size (`square`)."""
    wanted = {**families.PLAIN, "act_layer": config.act_layer, **expected}
    problems = [
        f"{name}={getattr(config, name)!r}"
        for name, value in wanted.items()
        if getattr(config, name) != value and not (value is ANY and getattr(config, name))
    ]
    if config.uses_fc_norm:
        problems.append("a LayerNorm after pooling (fc_norm)")
    sizes = {"image": config.img_size, "patch": config.patch_size}
    for name, size in sizes.items():
        pair = to_pair(size, name)
        if square and pair[0] != pair[1]:
            problems.append(f"a non-square {name} size {pair}")
    if problems:
        raise ValueError(
            f"transformers' {what} cannot hold this model: it has {', '.join(problems)}; {why}"
        )


def labels_to_hf(class_names: list[str] | None, num_classes: int) -> dict:
    names = class_names or [f"LABEL_{i}" for i in range(num_classes)]
    return {
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


# -- preprocessor_config.json --------------------------------------------------------------------
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def preprocess_from_hf(processor: dict, img_size: tuple[int, int]) -> dict:
    """A `preprocessor_config.json` -> `vit.Preprocess` fields.

    ViTImageProcessor (and SigLIP's) resizes both sides straight to `size`: crop_mode "squash"
    with crop_pct 1.0, as transformers runs it (images of the input's shape are only resized,
    in every mode). CLIP's and DINOv2's processors resize the shorter side to `size` and
    centre-crop `crop_size`, which is crop_pct = crop / shorter side (DINOv2: 224 / 256); a
    `size` of height and width before the crop (our writer's for a squash, or a non-square
    input) resizes both sides: crop_mode "squash" too."""
    size, crop = processor.get("size") or {}, processor.get("crop_size") or {}
    if isinstance(size, int):  # older processors: one number, the shorter side
        size = {"shortest_edge": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    height = size.get("height", size.get("shortest_edge", img_size[0]))
    width = size.get("width", size.get("shortest_edge", img_size[1]))
    # without a crop, a `size` of height and width is a resize of both sides: a squash
    crop_pct, crop_mode = 1.0, "squash" if "height" in size else "center"
    if processor.get("do_center_crop") and crop:
        if "shortest_edge" in size:
            crop_pct = crop_pct_of((crop["height"],), (size["shortest_edge"],))
        elif "height" in size:  # both sides resized to `size`: a squash
            crops, sizes = (crop["height"], crop["width"]), (size["height"], size["width"])
            crop_pct, crop_mode = crop_pct_of(crops, sizes), "squash"
        height, width = crop["height"], crop["width"]
    return dict(
        input_size=(int(height), int(width)),
        mean=tuple(processor.get("image_mean", (0.5, 0.5, 0.5))),
        std=tuple(processor.get("image_std", (0.5, 0.5, 0.5))),
        interpolation=PIL_RESAMPLE.get(processor.get("resample", 2), "bilinear"),
        crop_pct=crop_pct,
        crop_mode=crop_mode,
    )


def crop_pct_of(crops: tuple[int, ...], sizes: tuple[int, ...]) -> float:
    """The crop_pct with which the evaluation transform resizes each side to floor(crop /
    crop_pct) = its size before the centre crop: the least crop / size, nudged down where the
    division's rounding would make a side a pixel short (9 / (9 / 14) is 13.999...)."""
    crop_pct = min(crop / size for crop, size in zip(crops, sizes, strict=True))
    while any(math.floor(c / crop_pct) < s for c, s in zip(crops, sizes, strict=True)):
        crop_pct = math.nextafter(crop_pct, 0.0)
    return crop_pct


def preprocess_to_hf(preprocess) -> dict:
    """Our `Preprocess` -> a `preprocessor_config.json` dict: ViTImageProcessor's (a resize to
    the input size) without a crop (crop_pct 1), else DINOv2's BitImageProcessor (a resize to
    input / crop_pct, then the centre crop), so that the folder is evaluated as the model was
    (timm's default crop_pct is 0.9). The resize is the shorter side's for a square "center"
    input, both sides' otherwise: exact for "squash"; transformers has no resize that keeps the
    ratio to a non-square size, so a non-square "center" (or "border") model's folder squashes,
    and is read back as "squash". Without a crop (crop_pct 1), ViTImageProcessor's plain resize
    squashes images of another shape than the input's (read back as "squash", crop_pct 1)."""
    resample = {name: code for code, name in PIL_RESAMPLE.items()}
    height, width = preprocess.input_size
    if preprocess.crop_pct == 1.0:
        resize = {"image_processor_type": "ViTImageProcessor", "do_resize": True}
        resize["size"] = {"height": height, "width": width}
    else:  # the evaluation transform's scale size (eval_transform): one side or both
        resized = [math.floor(side / preprocess.crop_pct) for side in (height, width)]
        shorter_side = height == width and preprocess.crop_mode == "center"
        resize = {
            "image_processor_type": "BitImageProcessor",
            "do_resize": True,
            "size": (
                {"shortest_edge": resized[0]}
                if shorter_side
                else {"height": resized[0], "width": resized[1]}
            ),
            "do_center_crop": True,
            "crop_size": {"height": height, "width": width},
            "do_convert_rgb": True,
        }
    return {
        **resize,
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
