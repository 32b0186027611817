"""Reading checkpoint files, loading them into a model, saving ours with their config.

Files are read here; what their tensors are called is `vit.interop.layouts`' job, so every source
below works in every layout (timm's; transformers' ViT, MAE, DINOv2, CLIP, SigLIP and DeiT; the
original DINOv2's; OpenAI's and OpenCLIP's; torchvision's; Google's JAX):
  * `.safetensors` files (ours carry the model config and class names in their metadata),
  * torch pickles `.pth/.pt/.bin/.ckpt` holding a state dict, possibly under `model`/`state_dict`
    and/or with DistributedDataParallel's `module.` prefix -- read with `weights_only=True`,
    so a file that would run code while loading is refused,
  * Google's original JAX `.npz` checkpoints (vit_jax and big_vision layouts),
  * a transformers folder (`config.json` + `model.safetensors` or `pytorch_model.bin`),
    whose `model_type` must be one of those families (others are refused, named),
  * a model instance (timm's, ours, transformers' or torchvision's), or a plain dict of tensors.
"""

from __future__ import annotations

import io
import json
import logging
import math
import pickle
import pickletools
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from ..models.families import SWITCH_TENSORS
from ..models.pos_embed import RESAMPLERS, resample_abs_pos_embed, resample_pos_embed
from ..models.vision_transformer import VisionTransformer, holds_gated_mlp, to_pair
from ..utils.files import atomic_write
from . import layouts
from .layouts import hf_common
from .layouts.google_jax import convert_jax_checkpoint

# Re-exported: other modules and users import them from here.
__all__ = [
    "Checkpoint",
    "LoadReport",
    "WeightsMismatchError",
    "adapt_state_dict",
    "atomic_write",
    "convert_jax_checkpoint",
    "load_weights",
    "read_checkpoint",
    "read_metadata",
    "read_state_dict",
    "names_in_source",
    "resample_abs_pos_embed",
    "save_weights",
]

logger = logging.getLogger("vit")

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
ACCEPTED = (
    "a .safetensors, .pth/.pt/.bin/.ckpt or Google .npz file, a transformers folder "
    "(config.json + weights), an nn.Module, or a dict"
)
WRAPPER_KEYS = ("model", "state_dict", "model_state_dict")


@dataclass
class LoadReport:
    """What `load_weights` did, key by key."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the model, absent from the source
    unexpected: list[str] = field(default_factory=list)  # in the source, absent from the model
    fresh_head: bool = False  # the source's head was absent or of another num_classes
    fresh_pool: bool = False  # the new head reads by an attention pool the source lacked
    resampled_pos_embed: tuple | None = None  # (old grid, new grid) when resampled
    layout: str = "timm"  # the source's naming: timm, transformers, torchvision, google_jax
    messages: list[str] = field(default_factory=list)


class WeightsMismatchError(KeyError):
    """`load_weights(strict=True)` met keys the model and the weights do not share. `problem`
    states them (and the switches they belong to); the message adds the Python API's way round
    it, marked as Python's: the commands print the message as it is and have no such switch."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"{problem} (in Python: load_weights(..., strict=False) loads the rest)")
        self.problem = problem


class ArchitectureMismatchError(ValueError):
    """Weights whose tensors have other shapes than the model's (another width, MLP ratio,
    patch size...): weights of another architecture, which no loading switch adapts."""


@dataclass
class Checkpoint:
    """A source read and renamed to timm's names, with what it says about itself."""

    state_dict: dict[str, torch.Tensor]  # timm names, on the CPU
    metadata: dict = field(default_factory=dict)  # our "vit.*" metadata ({} for other files)
    layout: str = "timm"
    notes: list[str] = field(default_factory=list)  # what the conversion dropped or assumed
    norm_eps: float | None = None  # LayerNorm eps the weights were trained with, if known
    description: str = ""  # the source, for messages
    pos_embed: str = "timm"  # how the source resamples position embeddings (vit.models.pos_embed)
    # the patch grid the weights were made for, where the source says (our metadata, a
    # transformers config.json); else a square grid is assumed from the token count
    grid: tuple[int, int] | None = None


# -- reading files -------------------------------------------------------------------------------
def read_metadata(path: str | Path) -> dict:
    """The JSON-decoded metadata of one of our `.safetensors` files ({} when it has none)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"cannot read safetensors file {path}: {e}") from e
    return {key: json.loads(value) for key, value in raw.items() if key.startswith("vit.")}


def names_in_source(source: object) -> list[str]:
    """The names a weights source gives itself, beyond its path: a transformers folder's
    `model_type` and `_name_or_path` ("vit_mae", "facebook/vit-mae-base"), our file's model
    name; [] for anything else (tensors in memory, other files, a timm name)."""
    if not isinstance(source, (str, Path)):
        return []
    path = Path(source).expanduser()
    if (path / "config.json").is_file():
        config = hf_common.read_json(path / "config.json")
        return [str(config[key]) for key in ("model_type", "_name_or_path") if config.get(key)]
    if path.suffix == ".safetensors" and path.is_file():
        name = read_metadata(path).get("vit.model_name")
        return [name] if name else []
    return []


def _unwrap(state: Mapping, path: Path | str) -> dict[str, torch.Tensor]:
    """Peel training-checkpoint wrappers ({'model': sd}, {'state_dict': sd}) and `module.`."""
    for key in WRAPPER_KEYS:
        if key in state and isinstance(state[key], Mapping):
            state = state[key]
            break
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(
            f"{path} holds no tensors (top-level keys: {sorted(map(str, state))[:10]}); expected "
            f"a state dict, possibly under one of {WRAPPER_KEYS}"
        )
    if all(k.startswith("module.") for k in tensors):  # saved from DistributedDataParallel
        tensors = {k[len("module.") :]: v for k, v in tensors.items()}
    return tensors


def _read_torch(path: Path) -> dict[str, torch.Tensor]:
    state = torch_load(path)
    if not isinstance(state, Mapping):
        raise ValueError(f"{path} holds a {type(state).__name__}, expected a state dict")
    return _unwrap(state, path)


def torch_load(path: Path):
    """`torch.load(weights_only=True)` on the CPU, with a one-line ValueError naming the file
    for what it cannot read: a pickle that names code to run is refused (and never run), and
    anything else is not a checkpoint, or a truncated one."""
    try:
        # weights_only: a pickle may name arbitrary callables to run on load; refuse them.
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch says the same for random bytes and for a pickle with code (and advises the
        # unsafe weights_only=False for both): tell them apart by reading the pickle's opcodes.
        code = _pickled_callables(path)
        if code is None:
            raise ValueError(
                f"cannot read {path}: not a checkpoint (neither a torch.save archive nor a "
                f"pickle); accepted: {ACCEPTED}"
            ) from e
        whole_model = [name for name in code or () if name.startswith(MODULE_PICKLES)]
        if whole_model:
            raise ValueError(
                f"refused to load {path}: it is a whole pickled model ({whole_model[0]}), and only "
                f"weights are read; save its state dict instead: "
                f"torch.save(model.state_dict(), ...) (or vit.save_weights for a .safetensors)"
            ) from e
        if code:
            raise ValueError(
                f"refused to load {path}: it is a pickle that would run code while loading "
                f"({', '.join(code[:3])}), and only tensors and plain containers are read; save "
                f"the weights alone (torch.save(model.state_dict(), ...) or .safetensors)"
            ) from e
        raise ValueError(
            f"cannot read {path}: a pickle that torch's weights-only reader does not understand "
            f"(e.g. a newer pickle protocol); save it with torch.save(model.state_dict(), ...)"
        ) from e
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    except Exception as e:  # torch's readers fail in many ways on bytes that are not theirs
        raise ValueError(
            f"cannot read {path}: not a checkpoint, or a truncated one ({type(e).__name__}: "
            f"{str(e).split('. ')[0].splitlines()[0] if str(e) else 'no details'})"
        ) from e


SAFE_PICKLE_MODULES = ("torch", "collections", "builtins.set", "_codecs.encode", "numpy")
# What a torch.save(model) names: a model's classes, not tensors (and "torch" above would pass
# torch.nn.* and torchvision.* as harmless)
MODULE_PICKLES = ("torch.nn.modules.", "torchvision.", "timm.", "transformers.", "vit.")


def _pickled_callables(path: Path) -> list[str] | None:
    """The callables (module.name) that unpickling `path` would import and may call, other
    than torch's own; None if the file holds no pickle at all. Reads opcodes, runs nothing.

    A torch.save archive keeps its pickle in `*/data.pkl`; older files are pickles in a row
    followed by raw tensor bytes (reading stops at the first thing that is not a pickle)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("data.pkl")]
            if not names:
                return None
            data = archive.read(names[0])
    else:
        data = Path(path).read_bytes()
    stream, found, pickles = io.BytesIO(data), [], 0
    while stream.tell() < len(data):
        strings: list[str] = []
        try:
            for opcode, arg, _ in pickletools.genops(stream):
                if opcode.name in ("GLOBAL", "INST"):
                    found.append(str(arg).replace(" ", "."))
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(".".join(strings[-2:]))
                elif isinstance(arg, str):
                    strings.append(arg)
        except Exception:  # not (or no longer) a pickle
            break
        pickles += 1
    if not pickles:
        return None
    found = [name.replace("__builtin__.", "builtins.") for name in found]  # pickle protocol 2
    return [
        name
        for name in dict.fromkeys(found)
        if name.startswith(MODULE_PICKLES) or not name.startswith(SAFE_PICKLE_MODULES)
    ]


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):  # else np.load falls back to pickle and advises unpickling
        raise ValueError(f"cannot read {path}: not an .npz archive (a zip of arrays)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"cannot read {path}: truncated or not an .npz archive ({e})") from e


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as e:
        raise ValueError(f"cannot read {path}: truncated or corrupt safetensors ({e})") from e


def _read_file(path: Path) -> tuple[dict, dict]:
    """One weights file -> (tensors or arrays under the file's own names, our metadata or {})."""
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        metadata = read_metadata(path)
        return _read_safetensors(path), metadata
    if suffix in TORCH_SUFFIXES:
        return _read_torch(path), {}
    if suffix == ".npz":
        return _read_npz(path), {}
    raise ValueError(f"unsupported weights file {path} (suffix {suffix!r}); accepted: {ACCEPTED}")


def _read_transformers_folder(folder: Path) -> tuple[dict, float, tuple[int, int]]:
    """A transformers folder -> (its tensors, merged over shards; its LayerNorm eps; its patch
    grid, which config.json's image_size may make non-square)."""
    config = hf_common.read_json(folder / "config.json")
    # refuses what this package cannot compute, naming it
    arch, _ = layouts.config_from_transformers(config, source=str(folder))
    tensors: dict[str, torch.Tensor] = {}
    for path in hf_common.weights_files(folder):
        tensors.update(_read_file(path)[0])
    grid = tuple(i // p for i, p in zip(arch["img_size"], arch["patch_size"], strict=True))
    return tensors, arch["norm_eps"], grid


def read_checkpoint(source: str | Path | nn.Module | Mapping | Checkpoint) -> Checkpoint:
    """Any accepted source -> its tensors under timm's names, with its metadata and layout."""
    if isinstance(source, Checkpoint):
        return source
    norm_eps, metadata, grid = None, {}, None
    if isinstance(source, nn.Module):
        raw, description = dict(source.state_dict()), f"a {type(source).__name__}"
    elif isinstance(source, Mapping):
        raw, description = _unwrap(source, "the given dict"), "the given dict"
    elif isinstance(source, (str, Path)):
        path = description = Path(source)
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ValueError(f"{path} is a folder without config.json; accepted: {ACCEPTED}")
            raw, norm_eps, grid = _read_transformers_folder(path)
        elif not path.is_file():
            raise FileNotFoundError(f"weights file not found: {path}")
        else:
            raw, metadata = _read_file(path)
        description = str(description)
    else:
        raise TypeError(f"cannot load weights from a {type(source).__name__}; accepted: {ACCEPTED}")
    layout = layouts.detect(list(raw), description)
    if layout.name != "google_jax" and any(isinstance(v, np.ndarray) for v in raw.values()):
        # only Google's layout is converted from numpy; another would reach the model as arrays
        raise ValueError(
            f"cannot read {description}: numpy arrays (an .npz) are read in Google's JAX layout "
            f"only, and these are named in the {layout.name} layout; accepted: {ACCEPTED}"
        )
    state_dict, notes = layout.to_timm(raw, description)
    pos_embed = layout.pos_embed
    if "vit.config" in metadata:
        config = metadata["vit.config"]
        norm_eps = config.get("norm_eps", 1e-6)
        # Our file's layout is timm's, but its weights' source (a transformers DINOv2 folder,
        # say) resamples its own way: the config records it.
        pos_embed = config.get("pos_embed_resample", pos_embed)
        grid = _stored_grid(metadata)
    elif norm_eps is None:
        norm_eps = layout.norm_eps
    return Checkpoint(
        state_dict,
        metadata=metadata,
        layout=layout.name,
        notes=notes,
        norm_eps=norm_eps,
        description=description,
        pos_embed=pos_embed,
        grid=grid,
    )


def read_state_dict(source: str | Path | nn.Module | Mapping) -> tuple[dict, dict]:
    """Any accepted source -> (timm-named state dict on CPU, our metadata or {})."""
    checkpoint = read_checkpoint(source)
    return checkpoint.state_dict, checkpoint.metadata


# -- loading into a model ----------------------------------------------------------------------
def _stored_grid(metadata: dict) -> tuple[int, int] | None:
    """The patch grid a checkpoint was trained with, if its metadata says (non-square grids)."""
    config = metadata.get("vit.config")
    if not config:
        return None
    img = to_pair(config["img_size"], "img_size")
    patch = to_pair(config["patch_size"], "patch_size")
    return (img[0] // patch[0], img[1] // patch[1])


HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")  # dist: DeiT


def head_classes(state_dict: Mapping) -> int:
    """The number of classes a timm-named state dict's head gives (0 for a feature extractor)."""
    head = state_dict.get("head.weight")
    return 0 if head is None else head.shape[0]


def _mlp_hint(state_dict: Mapping[str, torch.Tensor], mlp_layer: str) -> str:
    """The mlp_layer that fits the weights, where the model has the other one."""
    gated = holds_gated_mlp(state_dict)
    if gated is None or gated == (mlp_layer == "swiglu_packed"):
        return ""
    if gated:
        return (
            "\n  the weights' MLP is gated (fc1 holds a gate and a value, twice fc2's input): "
            "build the model with mlp_layer='swiglu_packed', act_layer='silu' (DINOv2 ViT-g/14)"
        )
    return "\n  the weights' MLP is not gated: build the model with mlp_layer='mlp'"


def _switch_hint(report: LoadReport) -> str:
    """Which model switches (`vit.models.families.SWITCH_TENSORS`) the missing or unexpected keys
    belong to, if any."""
    parts = []
    for keys, side in ((report.unexpected, "have"), (report.missing, "lack")):
        switches = sorted(
            {
                s
                for s, fragments in SWITCH_TENSORS.items()
                for f in fragments
                for k in keys
                if f in k
            }
        )
        if switches:
            parts.append(f"the weights {side} the tensors of {', '.join(switches)}")
    if not parts:
        return ""
    return f" ({'; '.join(parts)}: build the model with the weights' switches)"


def adapt_state_dict(
    state_dict: dict,
    model: VisionTransformer,
    report: LoadReport,
    old_grid=None,
    pos_embed: str = "timm",
) -> dict:
    """Make a checkpoint fit `model`: resample position embeddings (the way `pos_embed` names,
    a `vit.models.pos_embed.RESAMPLERS` key: the checkpoint's source library's), drop a mismatched
    head."""
    state_dict = dict(state_dict)
    target = model.state_dict()
    pos = state_dict.get("pos_embed")
    prefix = model.pos_embed_prefix_tokens  # 0 with no_embed_class (DeiT III, DINOv2-reg)
    if pos is not None and old_grid and math.prod(old_grid) != pos.shape[1] - prefix:
        old_grid = None  # a grid said of other tokens (other prefix switches): checked below
    # As many tokens is not the same grid: a 4x6 grid read as 6x4 would be scrambled.
    regrid = old_grid is not None and tuple(old_grid) != tuple(model.grid_size)
    if pos is not None and (pos.shape != target["pos_embed"].shape or regrid):
        if pos.shape[-1] != target["pos_embed"].shape[-1]:
            raise ArchitectureMismatchError(
                f"pos_embed width {pos.shape[-1]} does not match the model's embed_dim "
                f"{target['pos_embed'].shape[-1]}: these weights are for another architecture"
            )
        side = math.isqrt(max(pos.shape[1] - prefix, 0))
        if old_grid is None and side * side != pos.shape[1] - prefix:
            raise ValueError(
                f"pos_embed of {pos.shape[1]} tokens is not this model's {prefix} prefix "
                f"position(s) plus a square grid: the weights were made with other prefix-token "
                f"switches (class_token, reg_tokens, no_embed_class, distilled)"
            )
        old = old_grid or (side, side)
        state_dict["pos_embed"] = resample_pos_embed(
            pos, model.grid_size, old, num_prefix_tokens=prefix, method=pos_embed
        )
        report.resampled_pos_embed = (tuple(old), tuple(model.grid_size))
        report.messages.append(
            f"resampled pos_embed from a {old[0]}x{old[1]} to a "
            f"{model.grid_size[0]}x{model.grid_size[1]} patch grid ({RESAMPLERS[pos_embed]})"
        )
    # a distillation head is the model's head too; into a plain model it is an unexpected key
    heads = HEAD_KEYS if model.config.distilled else HEAD_KEYS[:2]
    head_keys = [k for k in heads if k in state_dict]
    head_differs = any(k not in target or state_dict[k].shape != target[k].shape for k in head_keys)
    if head_keys and head_differs:
        old_classes = state_dict[head_keys[-1]].shape[0]
        for k in head_keys:
            del state_dict[k]
        report.fresh_head = True
        report.messages.append(
            f"dropped the checkpoint's {old_classes}-class head: the model has "
            f"num_classes={model.num_classes} and keeps its freshly initialised head"
        )
    elif not head_keys and "head.weight" in target:
        report.fresh_head = True
        report.messages.append(
            "the checkpoint has no classifier head (a feature extractor); the model keeps its "
            f"freshly initialised {model.num_classes}-class head"
        )
    moved = move_final_norm(state_dict, target)
    if moved:
        report.messages.append(moved)
    if report.fresh_head:
        report.fresh_pool, pool_message = new_head_pool(state_dict, target)
        if pool_message:
            report.messages.append(pool_message)
    return state_dict


def new_head_pool(state_dict: dict, target: dict) -> tuple[bool, str | None]:
    """A new head that reads the tokens otherwise than the weights did, by an attention pool
    (global_pool='map') or without one: the pool belongs to the head, as SigLIP's does. The
    model's pool, where the weights have none, stays freshly initialised (True, and why); the
    weights' pool, where the model has none, is dropped (in place)."""
    theirs = [k for k in state_dict if k.startswith("attn_pool.")]
    ours = any(k.startswith("attn_pool.") for k in target)
    if ours and not theirs:
        return True, (
            "the weights have no attention pool: the model's (global_pool='map') is freshly "
            "initialised, part of the new head"
        )
    if theirs and not ours:
        for key in theirs:
            del state_dict[key]
        return (
            False,
            "dropped the weights' attention pool (attn_pool.*): the new head reads otherwise",
        )
    return False, None


def move_final_norm(state_dict: dict, target: dict) -> str | None:
    """A model that reads another readout than its weights' own, the final LayerNorm on the
    other side of pooling ('avg' normalises the pooled features, fc_norm; 'token' every token
    before, norm): the weights' final norm moves there (in place), and the message says so.
    That is how a class-token backbone (MAE's) is fine-tuned with average pooling."""
    for old, new in (("norm.", "fc_norm."), ("fc_norm.", "norm.")):
        fits = f"{new}weight" in target and f"{old}weight" not in target
        if fits and f"{old}weight" in state_dict and f"{new}weight" not in state_dict:
            for key in [k for k in state_dict if k.startswith(old)]:
                state_dict[new + key[len(old) :]] = state_dict.pop(key)
            return (
                f"the weights' final LayerNorm ({old}*) normalises the model's readout as "
                f"{new}* (the model pools {'before' if new == 'fc_norm.' else 'after'} it)"
            )
    return None


def load_weights(
    model: VisionTransformer,
    source: str | Path | nn.Module | Mapping | Checkpoint,
    strict: bool = True,
) -> LoadReport:
    """Load weights from any accepted source, in any supported layout, into `model`, reporting
    every key.

    Position embeddings are resampled to the model's grid and a head of another size is
    dropped (both with a logged message). Any other missing or unexpected key raises a
    KeyError naming it when `strict`; otherwise it is logged and listed in the report.
    Shape mismatches always raise: they mean another architecture. A checkpoint trained with
    another LayerNorm eps than the model's (transformers' 1e-12) loads with a warning: the
    logits then differ slightly from the original's (`vit.create_model` and `vit.load_model`
    build the model with the checkpoint's eps).
    """
    checkpoint = read_checkpoint(source)
    report = LoadReport(layout=checkpoint.layout, messages=list(checkpoint.notes))
    eps = model.config.norm_eps
    if checkpoint.norm_eps is not None and not math.isclose(checkpoint.norm_eps, eps, rel_tol=1e-9):
        report.messages.append(
            f"{checkpoint.description} was trained with LayerNorm eps {checkpoint.norm_eps:g} "
            f"and the model uses {eps:g}: its logits will differ slightly from the original "
            f"model's; build the model with norm_eps={checkpoint.norm_eps:g} to match exactly"
        )
    state_dict = adapt_state_dict(
        checkpoint.state_dict,
        model,
        report,
        old_grid=checkpoint.grid,
        pos_embed=checkpoint.pos_embed,
    )
    target = model.state_dict()
    wrong_shape = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(target[k].shape)}"
        for k, v in state_dict.items()
        if k in target and v.shape != target[k].shape
    ]
    if wrong_shape:
        raise ArchitectureMismatchError(
            f"weights from {checkpoint.description} do not fit this model; shape mismatches:\n  "
            + "\n  ".join(wrong_shape)
            + _mlp_hint(state_dict, model.config.mlp_layer)
        )
    fresh = set(HEAD_KEYS) & set(target) if report.fresh_head else set()
    if report.fresh_pool:
        fresh |= {k for k in target if k.startswith("attn_pool.")}
    report.missing = sorted(set(target) - set(state_dict) - fresh)
    report.unexpected = sorted(set(state_dict) - set(target))
    if report.missing or report.unexpected:
        problem = (
            f"weights from {checkpoint.description}: missing keys {report.missing}, "
            f"unexpected keys {report.unexpected}{_switch_hint(report)}"
        )
        if strict:
            raise WeightsMismatchError(problem)
        report.messages.append(problem)
    model.load_state_dict({k: v for k, v in state_dict.items() if k in target}, strict=False)
    report.loaded = sorted(set(state_dict) & set(target))
    # What the conversion left out on purpose (a text tower, a mask token used in training only)
    # is information; what changes the model's outputs or weights (a resampled grid, a dropped
    # head, another eps, keys not loaded) is a warning.
    notes = len(checkpoint.notes)
    for message in report.messages[:notes]:
        logger.info("%s", message)
    for message in report.messages[notes:]:
        logger.warning("%s", message)
    return report


# -- saving ------------------------------------------------------------------------------------
def save_weights(
    model: VisionTransformer,
    path: str | Path,
    class_names: list[str] | None = None,
    model_name: str | None = None,
    preprocess: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Write `model`'s weights to a `.safetensors` file whose metadata holds everything needed
    to rebuild it (config, class names, preprocessing). Atomic: a temporary file in the same
    folder is renamed over the target, so a crash never leaves a half-written file.
    class_names, model_name and preprocess default to the model's own attributes (those
    `vit.load_model` sets), so that a model loaded and saved again keeps them."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"save_weights writes .safetensors files, got {path}")
    if class_names is None:
        own = getattr(model, "class_names", None)
        class_names = own if own and len(own) == model.num_classes else None
    model_name = model_name or getattr(model, "model_name", None)
    metadata = {"vit.config": model.config.to_dict()}
    if class_names is not None:
        if len(class_names) != model.num_classes:
            raise ValueError(
                f"{len(class_names)} class names for a model with {model.num_classes} classes"
            )
        metadata["vit.class_names"] = list(class_names)
    if model_name:
        metadata["vit.model_name"] = model_name
    preprocess = preprocess or getattr(getattr(model, "preprocess", None), "to_dict", dict)()
    if preprocess:
        metadata["vit.preprocess"] = preprocess
    for key, value in (extra or {}).items():
        metadata[f"vit.{key}"] = value
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write(
        path,
        lambda tmp: save_file(tensors, str(tmp), {k: json.dumps(v) for k, v in metadata.items()}),
    )
    return path
