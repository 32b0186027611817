"""Building models by name, with or without pretrained weights, and their eval transforms."""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from . import layouts
from .cli import pretrained_weights
from .configs import MODELS, Preprocess, close_model_names, get_spec, split_tag
from .feature_maps import FeatureMaps
from .layouts import hf_common, hf_dinov2
from .model import VisionTransformer, ViTConfig, model_class, to_pair
from .weights import load_weights, read_checkpoint, read_metadata


class PretrainedUnavailableError(ConnectionError, RuntimeError):
    """timm's pretrained weights cannot be downloaded (offline, no network) and are not cached.

    A ConnectionError; also a RuntimeError, which the command lines report in one line.
    `model_name` and `reason` say which weights and why; the message advises passing a local
    file instead, spelt as `vit.create_model` takes it (see `advising` for a command's flag).
    """

    def __init__(self, model_name: str, reason: str, spelling: str = "pretrained=PATH") -> None:
        self.model_name, self.reason = model_name, reason
        super().__init__(
            f"cannot download the pretrained weights of {model_name}: {reason}, and they are "
            f"not in the Hugging Face cache; pass {spelling} to a local weights file instead"
        )

    def advising(self, spelling: str) -> str:
        """The message with another spelling of the advice, e.g. "--pretrained PATH"."""
        return str(PretrainedUnavailableError(self.model_name, self.reason, spelling))


def create_model(
    name: str,
    pretrained: bool | str | Path = False,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    features_only: bool = False,
    out_indices: int | Sequence[int] = 3,
    **overrides,
) -> VisionTransformer | FeatureMaps:
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
    features_only, out_indices: timm's: instead of the model, a `vit.feature_maps.FeatureMaps`
        whose forward gives the outputs of blocks `out_indices` (the last n if an int) as
        (B, D, gh, gw) maps, the blocks after them, the final norm and the head pruned.
    overrides: any other `ViTConfig` field, e.g. drop_path_rate=0.1, or dynamic_img_size=True
        (any input size that is a multiple of the patch size; the position embeddings are
        resampled per call the way the weights' source library does, `pos_embed_resample`).
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
    if checkpoint is not None and "pos_embed_resample" not in overrides:
        kwargs["pos_embed_resample"] = checkpoint.pos_embed  # the weights' source library's way
    model = model_class(kwargs)(**kwargs)
    layout = layouts.BY_NAME[checkpoint.layout] if checkpoint is not None else None
    if layout is not None and layout.preprocess is not None:  # the weights' own (torchvision's)
        preprocess = Preprocess.from_dict(layout.preprocess(preprocess.input_size))
    model.preprocess = preprocess
    model.model_name = name
    if checkpoint is not None:
        load_weights(model, checkpoint)
    return FeatureMaps(model, out_indices) if features_only else model


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
        raise PretrainedUnavailableError(full_name, offline)
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
    path: str | Path,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    dynamic_img_size: bool | None = None,
) -> VisionTransformer:
    """Rebuild a model from a file or folder that says what architecture it holds.

    path: a `.safetensors` file written by `vit.save_weights` (the architecture, class names
        and preprocessing come from its metadata), or a transformers folder (`config.json` +
        `model.safetensors` or `pytorch_model.bin`; `preprocessor_config.json` if present) of
        a ViT, ViT-MAE, DINOv2, CLIP, SigLIP or distilled DeiT model.
    num_classes: replace the classifier (the stored head is then dropped).
    img_size: build the model for this input size (position embeddings resampled the way the
        weights' source library does). A transformers folder defaults to the size its
        preprocessing produces, except DINOv2's (below).
    dynamic_img_size: accept any input size that is a multiple of the patch size, the
        position embeddings resampled per call the way the weights' source library does
        (timm's option). None: as stored (our files), or as transformers runs the folder's
        model: True for DINOv2 (+- registers), which transformers resamples in every forward,
        so the model keeps the stored 518-px grid (37x37) and equals transformers at any
        size; its preprocessing stays 224 px (DINOv2's transform when the folder has no
        preprocessor_config.json). False for the other transformers families.
    The result is ready for inference, as transformers' `from_pretrained`: in eval mode
    (dropout, stochastic depth and patch dropout off; `.train()` turns them back on for
    fine-tuning). It carries `model.class_names` (None when unknown), `model.model_name` and
    `model.preprocess`.
    """
    path = Path(path)
    if path.is_dir():
        return _load_transformers_folder(path, num_classes, img_size, dynamic_img_size).eval()
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
    if dynamic_img_size is not None:
        config["dynamic_img_size"] = dynamic_img_size
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
    folder: Path,
    num_classes: int | None,
    img_size: int | tuple[int, int] | None,
    dynamic_img_size: bool | None,
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
    dinov2 = hf_config.get("model_type") in hf_dinov2.MODEL_TYPES
    processor = folder / "preprocessor_config.json"
    settings = hf_common.read_json(processor) if processor.is_file() else {}
    settings = settings or (hf_dinov2.PREPROCESSOR if dinov2 else {})
    preprocess = hf_common.preprocess_from_hf(settings, config["img_size"])
    if num_classes is not None:
        config["num_classes"] = num_classes
    checkpoint = read_checkpoint(folder)
    dynamic = dinov2 if dynamic_img_size is None else dynamic_img_size
    config.update(dynamic_img_size=dynamic, pos_embed_resample=checkpoint.pos_embed)
    if img_size:
        config["img_size"] = preprocess["input_size"] = to_pair(img_size, "img_size")
    elif not dynamic:
        config["img_size"] = preprocess["input_size"]
    # else the stored grid is kept and resampled to each input, as the source library does
    model = model_class(config)(**config)
    load_weights(model, checkpoint)
    model.class_names = class_names if len(class_names or ()) == model.num_classes else None
    model.model_name = hf_config.get("_name_or_path") or folder.name
    model.preprocess = Preprocess.from_dict(preprocess)
    return model


# -- the model argument of every command ------------------------------------------------------
class ModelArgumentError(ValueError):
    """A model argument that names no model this package can build: a misspelt name, a missing
    path, a file that does not say its architecture, timm's weights out of reach, ... Its
    message is one line naming the argument and what would be accepted."""


@dataclass(frozen=True)
class ArgumentNames:
    """How a caller spells the model arguments in messages: the Python keywords of
    `resolve_model` (the default), or a command's flags (see `command_arguments`)."""

    source: str = "source"
    model: str = "model"
    pretrained: str = "pretrained"
    keywords: bool = True  # `model=NAME`; False for flags: `--model NAME`

    def given(self, role: str, value: object) -> str:
        """The argument as given: "--checkpoint runs/x", or "source='runs/x'"."""
        name = getattr(self, role)
        return f"{name}={str(value)!r}" if self.keywords else f"{name} {value}"

    def wanted(self, role: str, placeholder: str) -> str:
        """How to give it: "--model NAME", or "model=NAME"."""
        name = getattr(self, role)
        return f"{name}={placeholder}" if self.keywords else f"{name} {placeholder}"

    @property
    def timm_weights(self) -> str:
        """How to ask for timm's published weights: "--pretrained", or "pretrained=True"."""
        return f"{self.pretrained}=True" if self.keywords else self.pretrained


PYTHON_ARGUMENTS = ArgumentNames()
# Suffixes that make an argument a path even where no such file exists (a name has none of them).
PATH_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".npz", ".onnx", ".json")


def command_arguments(source: str = "--checkpoint") -> ArgumentNames:
    """The flags of evaluate.py, `vit.predict` and `vit.export` (`source`: how the command
    names its weights argument, e.g. export's positional "CHECKPOINT")."""
    return ArgumentNames(source=source, model="--model", pretrained="--pretrained", keywords=False)


def model_from_flags(
    args: argparse.Namespace, source: str = "--checkpoint", onnx: bool = False
) -> VisionTransformer:
    """`resolve_model` of a command's --checkpoint (`source`: how the command names it, e.g.
    export's positional "CHECKPOINT"), --model and --pretrained (`vit.cli.add_model_arguments`),
    its messages spelt with those flags. onnx: an exported ONNX file is run (a
    `vit.onnx_model.OnnxModel`) rather than refused."""
    return resolve_model(
        args.checkpoint,
        model=args.model,
        pretrained=pretrained_weights(args.pretrained),
        names=command_arguments(source),
        onnx=onnx,
    )


def resolve_model(
    source: str | Path | None = None,
    *,
    model: str | None = None,
    pretrained: bool | str | Path | None = None,
    names: ArgumentNames = PYTHON_ARGUMENTS,
    random_init: bool = False,
    onnx: bool = False,
) -> VisionTransformer:
    """The model an argument means, the same for every command and the Python API: in eval
    mode, with `class_names` (None when the weights name no classes, see `class_names_for`),
    `model_name` and `preprocess`.

    source: one of
        - a model name of `vit.list_models()`, with or without a pretrained tag
          ("vit_base_patch16_224.augreg_in21k"), with `pretrained`;
        - one of our `.safetensors` files (its metadata says the architecture);
        - a train.py run folder (its model.safetensors), or any weights file in it;
        - a transformers folder of a family the package reads (`vit.load_model`);
        - a weights file in another layout (timm, torchvision or transformers state dict,
          Google .npz) with `model`.
    model: the architecture of a weights file that does not say it. Alone (no source): that
        model with `pretrained`, by default timm's published weights.
    pretrained: with a model name, True for timm's weights or a weights file (any layout).
    names: how messages spell the arguments (`command_arguments()` for a command's flags).
    random_init: accept a model name without weights (a freshly initialised model), which is
        otherwise refused: random weights classify nothing.
    onnx: an ONNX file exported by `vit.export` is run in onnxruntime (a
        `vit.onnx_model.OnnxModel`: inference only); refused otherwise.
    Anything else raises `ModelArgumentError` in one line.
    """
    role = "source"
    if source is None:
        if model is None:
            raise ModelArgumentError(
                f"no model given: pass {names.source} (a model name, a weights file or "
                f"folder) or {names.wanted('model', 'NAME')}"
            )
        # NAME alone: that architecture with timm's published weights, unless pretrained says
        source, model, role = model, None, "model"
        pretrained = pretrained or True
    path = Path(source)
    if path.exists():
        return _model_from_path(path, model, pretrained, names, onnx).eval()
    if _looks_like_path(str(source)):
        raise ModelArgumentError(f"{names.given(role, source)}: no such file or folder")
    if model is not None:
        raise ModelArgumentError(
            f"{names.given('model', model)} names the architecture of a weights file; "
            f"{names.given(role, source)} is a model name already: give one of them"
        )
    return _model_from_name(str(source), role, pretrained, names, random_init).eval()


def class_names_for(model: VisionTransformer) -> list[str]:
    """One name per output, the same in every command: the names stored with the weights;
    for a 1000-class head without them, ImageNet-1k's human-readable labels ("tench, Tinca
    tinca", timm's `ImageNetInfo`); otherwise "class 0", "class 1", ..."""
    names = getattr(model, "class_names", None)
    if names:
        return list(names)
    if model.num_classes == 1000:
        from timm.data import ImageNetInfo  # ships with timm: no download

        info = ImageNetInfo()
        return [info.index_to_description(i) for i in range(1000)]
    return [f"class {i}" for i in range(model.num_classes)]


def _looks_like_path(text: str) -> bool:
    """A path rather than a model name: a folder separator or a weights file suffix."""
    return "/" in text or os.sep in text or Path(text).suffix.lower() in PATH_SUFFIXES


def _run_weights(path: Path) -> Path:
    """A train.py run folder -> its model.safetensors; any other path as it is."""
    weights = path / "model.safetensors"
    is_run = path.is_dir() and weights.is_file() and not (path / "config.json").exists()
    return weights if is_run else path


def _checked_name(name: str, role: str, names: ArgumentNames) -> None:
    """Refuse an unknown model name (naming close ones) or an unknown pretrained tag."""
    if split_tag(name)[0] not in MODELS:
        close = close_model_names(name)
        hint = f"did you mean {', '.join(close)}?" if close else "see vit.list_models()"
        what = "no such model name" + (", file or folder" if role == "source" else "")
        raise ModelArgumentError(f"{names.given(role, name)}: {what}; {hint}")
    try:
        get_spec(name)
    except ValueError as e:  # an unknown tag: the message names the offered ones
        raise ModelArgumentError(f"{names.given(role, name)}: {e}") from None


def _model_from_name(
    name: str,
    role: str,
    pretrained: bool | str | Path | None,
    names: ArgumentNames,
    random_init: bool,
) -> VisionTransformer:
    """A model name with timm's weights (pretrained=True) or a weights file's."""
    _checked_name(name, role, names)
    given = names.given(role, name)
    if not pretrained:
        if random_init:
            return create_model(name)
        raise ModelArgumentError(
            f"{given} is a model name: pass {names.timm_weights} (timm's weights) or "
            f"{names.wanted('pretrained', 'PATH')} (a weights file); random weights classify "
            f"nothing"
        )
    if pretrained is True:
        if get_spec(name).pretrained_tag is None:
            raise ModelArgumentError(
                f"{given}: no published pretrained weights for {name}; pass "
                f"{names.wanted('pretrained', 'PATH')} (e.g. a run folder's model.safetensors)"
            )
        weights: bool | Path = True
    else:
        weights = _run_weights(Path(pretrained))
        if not weights.exists():
            raise ModelArgumentError(
                f"{names.given('pretrained', pretrained)}: no such file or folder"
            )
        _refuse_onnx(weights, names.given("pretrained", pretrained))
    try:
        return create_model(name, pretrained=weights)
    except PretrainedUnavailableError as e:
        advice = e.advising(names.wanted("pretrained", "PATH"))
        raise ModelArgumentError(f"{given}: {advice}") from None
    except (ValueError, KeyError, OSError) as e:
        raise ModelArgumentError(
            f"{names.given('pretrained', pretrained)}: {_one_line(e, weights)}"
        ) from None


def _model_from_path(
    path: Path,
    model: str | None,
    pretrained: bool | str | Path | None,
    names: ArgumentNames,
    onnx: bool = False,
) -> VisionTransformer:
    """Our .safetensors, a run folder, a transformers folder, a foreign file with `model`, or
    (`onnx`) an exported ONNX file."""
    given = names.given("source", path)
    weights = _run_weights(path)
    if weights.is_dir() and not (weights / "config.json").is_file():
        raise ModelArgumentError(
            f"{given}: a folder with neither config.json (a transformers folder) nor "
            f"model.safetensors (a train.py run folder)"
        )
    if not onnx:
        _refuse_onnx(weights, given)
    if pretrained:  # it would be ignored: say so rather than load other weights
        shown = names.timm_weights if pretrained is True else names.given("pretrained", pretrained)
        raise ModelArgumentError(
            f"{shown} goes with a model name; {given} holds its own weights: leave out "
            f"{names.pretrained}, or name a model"
        )
    onnx_file = weights.suffix.lower() == ".onnx"  # accepted only with `onnx`, checked above
    try:
        says_architecture = (
            onnx_file
            or weights.is_dir()
            or (weights.suffix == ".safetensors" and "vit.config" in read_metadata(weights))
        )
        if says_architecture and model is not None:
            raise ModelArgumentError(
                f"{names.given('model', model)} names the architecture of a weights file that "
                f"does not record it; {given} records its own: leave out {names.model}"
            )
        if onnx_file:
            from .onnx_model import OnnxModel

            return OnnxModel(weights)
        if says_architecture:
            return load_model(weights)
        if model is None:
            raise ModelArgumentError(
                f"{given} does not say which architecture it holds: pass "
                f"{names.wanted('model', 'NAME')} (see vit.list_models())"
            )
        _checked_name(model, "model", names)
        return create_model(model, pretrained=weights)
    except ModelArgumentError:
        raise
    except (ValueError, KeyError, OSError) as e:
        raise ModelArgumentError(f"{given}: {_one_line(e, weights, path)}") from None


def _first_items(match: re.Match, shown: int = 4) -> str:
    """A bracketed list of a message, cut after `shown` items (200 missing keys in one line)."""
    items = match.group(1).split(", ")
    if len(items) <= shown + 1:
        return match.group(0)
    return f"[{', '.join(items[:shown])}, ... ({len(items)} in all)]"


def _refuse_onnx(path: Path, given: str) -> None:
    if path.suffix.lower() == ".onnx":
        raise ModelArgumentError(
            f"{given}: an ONNX file, which only evaluate.py and python -m vit.predict run; pass "
            f"the weights it was exported from (our .safetensors, a run folder, a transformers "
            f"folder)"
        )


def _one_line(error: BaseException, *paths: Path) -> str:
    """An error's message as one line, without a leading path (the caller names it): lines
    joined, a long list cut after three items."""
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 4:
        lines = lines[:4] + [f"... ({len(lines) - 4} more)"]
    joined = lines[0] if lines else type(error).__name__
    for line in lines[1:]:
        joined += (" " if joined.endswith(":") else "; ") + line
    joined = re.sub(r"\[([^\[\]]*)\]", _first_items, joined)
    for path in paths:
        for prefix in (f"{path}: ", f"{path} "):
            if joined.startswith(prefix):
                return joined[len(prefix) :]
    return joined


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
        # Imported here: albumentations and OpenCV, which the training pipeline needs, are
        # not needed to build or run a model.
        from .transforms import AugmentConfig, TrainTransform

        return TrainTransform(preprocess, aug or AugmentConfig())
    from .eval_transform import eval_transform

    return eval_transform(preprocess)


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
