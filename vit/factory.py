"""Building models by name, with or without pretrained weights, and their eval transforms."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from . import layouts
from .configs import Preprocess, get_spec, split_tag
from .layouts import hf_common
from .model import VisionTransformer, ViTConfig, model_class, to_pair
from .weights import load_weights, read_checkpoint, read_metadata


class PretrainedUnavailableError(ConnectionError, RuntimeError):
    """timm's pretrained weights cannot be downloaded (offline, no network) and are not cached.

    A ConnectionError; also a RuntimeError, which the command lines report in one line.
    """


def create_model(
    name: str,
    pretrained: bool | str | Path = False,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    **overrides,
) -> VisionTransformer:
    """Build a named ViT, e.g. `create_model("vit_base_patch16_224", pretrained=True)`.

    name: one of `vit.list_models()`, optionally with one of timm's pretrained tags
        ("vit_base_patch16_224.dino", see `vit.list_models(pretrained=True)`), which selects
        those weights' preprocessing and head size.
    pretrained: False for fresh initialisation; True for timm's pretrained weights for this
        name and tag (its default tag without one; downloaded through timm from the Hugging
        Face hub, or read from its cache offline); or a weights file path in any layout
        `vit.load_weights` reads (timm, transformers, torchvision, Google JAX).
    num_classes: replace the classifier (a pretrained head of another size is dropped).
    img_size: another input size; pretrained position embeddings are resampled to it.
    overrides: any other `ViTConfig` field, e.g. drop_path_rate=0.1.
    The model comes back in training mode, as timm's `create_model` (and any new nn.Module):
    call `.eval()` before inference, or use `vit.load_model`, which returns an eval model.
    The model's `preprocess` attribute says how to prepare images (see `create_transform`):
    the name's (timm's) preprocessing, or torchvision's for torchvision weights. With weights
    whose LayerNorm eps is known (transformers': 1e-12) the model is built with that eps, so
    its logits equal the original model's, unless `norm_eps` is overridden.
    """
    spec = get_spec(name)
    unknown = set(overrides) - set(ViTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(
            f"unknown override(s) {sorted(unknown)} for {name}; "
            f"accepted: {sorted(ViTConfig.__dataclass_fields__)}"
        )
    kwargs = {**spec.arch, "num_classes": spec.num_classes, **overrides}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    preprocess = spec.preprocess
    if img_size is not None:
        kwargs["img_size"] = img_size
        preprocess = replace(preprocess, input_size=to_pair(img_size, "img_size"))
    checkpoint = None
    if pretrained is True:
        checkpoint = read_checkpoint(_timm_pretrained(split_tag(name)[0], spec.pretrained_tag))
    elif pretrained:
        checkpoint = read_checkpoint(pretrained)
    if checkpoint is not None and checkpoint.norm_eps is not None and "norm_eps" not in overrides:
        kwargs["norm_eps"] = checkpoint.norm_eps
    model = model_class(kwargs)(**kwargs)
    layout = layouts.BY_NAME[checkpoint.layout] if checkpoint is not None else None
    if layout is not None and layout.preprocess is not None:  # the weights' own (torchvision's)
        preprocess = Preprocess.from_dict(layout.preprocess(preprocess.input_size))
    model.preprocess = preprocess
    model.model_name = name
    if checkpoint is not None:
        load_weights(model, checkpoint)
    return model


def _timm_pretrained(name: str, tag: str | None):
    """timm's pretrained model `name.tag` (timm downloads, caches and converts the weights).

    Offline (HF_HUB_OFFLINE set, or the hub unreachable) weights already in the Hugging Face
    cache are read from it; otherwise one line says so at once, instead of the hub client's
    retries.
    """
    if tag is None:
        raise ValueError(
            f"no published pretrained weights for {name}; pass pretrained=PATH to a weights file "
            f"(e.g. a run folder's model.safetensors)"
        )
    import timm  # imported here: only this path needs it

    full_name = f"{name}.{tag}"
    cached = _cached_timm_weights(full_name)
    if cached is not None:
        return timm.create_model(
            full_name, pretrained=True, pretrained_cfg_overlay={"file": cached}
        )
    offline = _hub_offline_reason()
    if offline:
        raise PretrainedUnavailableError(
            f"cannot download the pretrained weights of {full_name}: {offline}, and they are not "
            f"in the Hugging Face cache; pass pretrained=PATH to a local weights file instead"
        )
    return timm.create_model(full_name, pretrained=True)


def _cached_timm_weights(full_name: str) -> str | None:
    """The path of `full_name`'s weights in the Hugging Face cache, if they are there."""
    from huggingface_hub import try_to_load_from_cache
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(full_name)
    if cfg is None or not cfg.hf_hub_id:
        return None
    names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else []
    for filename in names + ["model.safetensors", "pytorch_model.bin"]:
        path = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(path, str):
            return path
    return None


def _hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached, or None: HF_HUB_OFFLINE, or no connection
    to the hub (or the proxy) within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy or endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"no network connection to {host}:{port} ({e})"
    return None


def load_model(
    path: str | Path, num_classes: int | None = None, img_size: int | tuple[int, int] | None = None
) -> VisionTransformer:
    """Rebuild a model from a file or folder that says what architecture it holds.

    path: a `.safetensors` file written by `vit.save_weights` (the architecture, class names
        and preprocessing come from its metadata), or a transformers folder (`config.json` +
        `model.safetensors` or `pytorch_model.bin`; `preprocessor_config.json` if present) of
        a ViT, ViT-MAE, DINOv2, CLIP, SigLIP or distilled DeiT model.
    num_classes: replace the classifier (the stored head is then dropped).
    img_size: build the model for this input size (position embeddings resampled the way the
        weights' source library does). A transformers folder defaults to the size its
        preprocessing produces (DINOv2: 224 px, though config.json says 518).
    The result is ready for inference, as transformers' `from_pretrained`: in eval mode
    (dropout, stochastic depth and patch dropout off; `.train()` turns them back on for
    fine-tuning). It carries `model.class_names` (None when unknown), `model.model_name` and
    `model.preprocess`.
    """
    path = Path(path)
    if path.is_dir():
        return _load_transformers_folder(path, num_classes, img_size).eval()
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file or folder; vit.load_model reads our .safetensors files and "
            f"transformers folders (config.json + weights)"
        )
    if path.suffix != ".safetensors":
        raise ValueError(
            f"{path} does not say which architecture it holds (only our .safetensors files and "
            f"transformers folders do); load it with vit.create_model(NAME, pretrained="
            f"{str(path)!r}) instead"
        )
    metadata = read_metadata(path)
    if "vit.config" not in metadata:
        raise ValueError(
            f"{path} does not say which architecture it holds (no 'vit.config' metadata); "
            f"load it with vit.create_model(NAME, pretrained={str(path)!r}) instead"
        )
    config = dict(metadata["vit.config"])
    if num_classes is not None:
        config["num_classes"] = num_classes
    if img_size is not None:
        config["img_size"] = img_size
    model = model_class(config)(**config)
    load_weights(model, path)
    model.class_names = metadata.get("vit.class_names")
    model.model_name = metadata.get("vit.model_name")
    stored = metadata.get("vit.preprocess")
    model.preprocess = (
        Preprocess.from_dict(stored)
        if stored
        else Preprocess(input_size=model.patch_embed.img_size)
    )
    return model.eval()


def _load_transformers_folder(
    folder: Path, num_classes: int | None, img_size: int | tuple[int, int] | None
) -> VisionTransformer:
    """A transformers folder -> our model, architecture and class names from config.json, at
    the input size of its preprocessing unless `img_size` says otherwise."""
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} is a folder without config.json: vit.load_model reads transformers "
            f"folders (config.json + model.safetensors or pytorch_model.bin) or our "
            f".safetensors files"
        )
    hf_config = hf_common.read_json(folder / "config.json")
    config, class_names = layouts.config_from_transformers(hf_config, source=str(folder))
    processor = folder / "preprocessor_config.json"
    settings = hf_common.read_json(processor) if processor.is_file() else {}
    preprocess = hf_common.preprocess_from_hf(settings, config["img_size"])
    if num_classes is not None:
        config["num_classes"] = num_classes
    config["img_size"] = to_pair(img_size, "img_size") if img_size else preprocess["input_size"]
    preprocess["input_size"] = config["img_size"]
    model = model_class(config)(**config)
    load_weights(model, folder)
    model.class_names = class_names if len(class_names or ()) == model.num_classes else None
    model.model_name = hf_config.get("_name_or_path") or folder.name
    model.preprocess = Preprocess.from_dict(preprocess)
    return model


def create_transform(
    preprocess: Preprocess | str | dict | VisionTransformer,
    is_training: bool = False,
    aug=None,
) -> Callable:
    """The transform for a PIL image, from a `Preprocess`, a model name ("vit_base_patch16_224",
    with an optional ".tag"), a model (its `preprocess`), or a timm data config dict
    (`input_size` (C, H, W), `mean`, `std`, `interpolation`, `crop_pct`).

    Evaluation (the default): resize, centre crop, tensor, normalise, matching timm's eval
    transform: the resize target is input_size / crop_pct (floored), on the shorter side for
    square inputs and on both sides otherwise.
    is_training: the project's training augmentation instead (`vit.transforms.train_transform`:
    crop, flip, RandAugment, random erasing, normalise) with `aug` (a
    `vit.transforms.AugmentConfig`, its defaults if None); random on every call.
    """
    preprocess = _as_preprocess(preprocess)
    if is_training:
        # Imported here: vit.transforms builds its eval transform with this module's.
        from .transforms import AugmentConfig, TrainTransform

        return TrainTransform(preprocess, aug or AugmentConfig())

    # Imported here: torchvision's import costs ~1.4 s (it loads torchvision.models and
    # torch._dynamo), which `import vit` and create_model should not pay.
    from torchvision import transforms as T

    height, width = preprocess.input_size
    interpolation = T.InterpolationMode(preprocess.interpolation)
    if height == width:
        resize = math.floor(height / preprocess.crop_pct)
    else:
        resize = (math.floor(height / preprocess.crop_pct), math.floor(width / preprocess.crop_pct))
    return T.Compose(
        [
            T.Resize(resize, interpolation=interpolation),
            T.CenterCrop((height, width)),
            T.ToTensor(),
            T.Normalize(preprocess.mean, preprocess.std),
        ]
    )


def _as_preprocess(source) -> Preprocess:
    if isinstance(source, Preprocess):
        return source
    if isinstance(source, str):
        return get_spec(source).preprocess
    if isinstance(source, VisionTransformer):
        if source.preprocess is None:
            raise ValueError("this model has no preprocess; build it with vit.create_model")
        return source.preprocess
    if isinstance(source, dict):
        keys = ("input_size", "mean", "std", "interpolation", "crop_pct")
        missing = [k for k in keys if k not in source]
        if missing:
            raise ValueError(f"data config lacks {missing}; a timm data config has {list(keys)}")
        values = {k: source[k] for k in keys}
        values["input_size"] = tuple(values["input_size"])[-2:]  # timm's is (C, H, W)
        return Preprocess.from_dict(values)
    raise TypeError(
        f"create_transform takes a Preprocess, a model name, a model or a timm data config "
        f"dict, got a {type(source).__name__}"
    )
