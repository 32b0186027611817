"""The model argument of every command, and of `vit.resolve_model`: one grammar, one wording.

A source is a model name (with a pretrained tag, --pretrained), one of our .safetensors files, a
vit.train run folder, a transformers folder, a weights file of another layout (with --model), or
an exported ONNX file (where a command runs one). `resolve_model` says which, builds it with
`vit.create_model` / `vit.load_model` (which raise plain exceptions carrying the facts) and
turns any mistake into one `ModelArgumentError` line that names the argument as the caller spelt
it: `source='x'` for Python, `--checkpoint x` for a command (`command_arguments`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from ..factory.create import create_model, load_model
from ..factory.timm_weights import PretrainedUnavailableError, pretrained_weights, run_weights
from ..interop.weights import read_metadata
from ..models.registry import MODELS, close_model_names, get_spec, split_tag
from ..models.vision_transformer import VisionTransformer
from ..utils.messages import one_line


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
    """The flags of `vit.evaluate`, `vit.predict` and `vit.export` (`source`: how the command
    names its weights argument, e.g. export's positional "CHECKPOINT")."""
    return ArgumentNames(source=source, model="--model", pretrained="--pretrained", keywords=False)


def model_from_flags(
    args: argparse.Namespace, source: str = "--checkpoint", onnx: bool | str = False
) -> VisionTransformer:
    """`resolve_model` of a command's --checkpoint (`source`: how the command names it, e.g.
    export's positional "CHECKPOINT"), --model and --pretrained
    (`vit.cli.flags.add_model_arguments`), its messages spelt with those flags. onnx: an exported
    ONNX file is run (a `vit.interop.onnx_runtime.OnnxModel`, by the runtime `onnx` names, or
    onnxruntime for True) rather than refused."""
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
    onnx: bool | str = False,
) -> VisionTransformer:
    """The model an argument means, the same for every command and the Python API: in eval
    mode, with `class_names` (None when the weights name no classes, see `class_names_for`),
    `model_name` and `preprocess`.

    source: one of
        - a model name of `vit.list_models()`, with or without a pretrained tag
          ("vit_base_patch16_224.augreg_in21k"), with `pretrained`;
        - one of our `.safetensors` files (its metadata says the architecture);
        - a vit.train run folder (its model.safetensors), or any weights file in it;
        - a transformers folder of a family the package reads (`vit.load_model`);
        - a weights file in another layout (timm, torchvision or transformers state dict,
          Google .npz) with `model`.
    model: the architecture of a weights file that does not say it. Alone (no source): that
        model with `pretrained`, by default timm's published weights.
    pretrained: with a model name, True for timm's weights or a weights file (any layout).
    names: how messages spell the arguments (`command_arguments()` for a command's flags).
    random_init: accept a model name without weights (a freshly initialised model), which is
        otherwise refused: random weights classify nothing.
    onnx: an ONNX file exported by `vit.export` is run (a `vit.interop.onnx_runtime.OnnxModel`:
        inference only) by the runtime it names ("onnxruntime" for True, "openvino"); refused
        otherwise.
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
    hub = _hub_model_name(str(source))
    if hub is not None:  # timm's hub ids name a model and its tag; the weights come through timm
        with_weights = f" with {names.timm_weights}" if role == "source" else ""
        raise ModelArgumentError(
            f"{names.given(role, source)}: a Hugging Face Hub id, which is not read directly; "
            f"name the model as timm does, {hub}{with_weights} (its weights come through timm)"
        )
    if _looks_like_path(str(source)):
        raise ModelArgumentError(f"{names.given(role, source)}: no such file or folder")
    if model is not None:
        raise ModelArgumentError(
            f"{names.given('model', model)} names the architecture of a weights file; "
            f"{names.given(role, source)} is a model name already: give one of them"
        )
    return _model_from_name(str(source), role, pretrained, names, random_init).eval()


def _hub_model_name(text: str) -> str | None:
    """'hf-hub:timm/vit_base_patch16_224.augreg_in1k' or 'timm/vit_...' -> the model name with
    its tag; None for anything else."""
    name = text.removeprefix("hf-hub:").removeprefix("hf_hub:")
    if not name.startswith("timm/") or name.count("/") != 1:
        return None
    name = name.removeprefix("timm/")
    return name if split_tag(name)[0] in MODELS else None


def _looks_like_path(text: str) -> bool:
    """A path rather than a model name: a folder separator or a weights file suffix."""
    return "/" in text or os.sep in text or Path(text).suffix.lower() in PATH_SUFFIXES


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
        weights = run_weights(Path(pretrained))
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
            f"{names.given('pretrained', pretrained)}: {one_line(e, weights)}"
        ) from None


def _model_from_path(
    path: Path,
    model: str | None,
    pretrained: bool | str | Path | None,
    names: ArgumentNames,
    onnx: bool | str = False,
) -> VisionTransformer:
    """Our .safetensors, a run folder, a transformers folder, a foreign file with `model`, or
    (`onnx`) an exported ONNX file."""
    given = names.given("source", path)
    weights = run_weights(path)
    if weights.is_dir() and not (weights / "config.json").is_file():
        raise ModelArgumentError(
            f"{given}: a folder with neither config.json (a transformers folder) nor "
            f"model.safetensors (a vit.train run folder)"
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
            from ..interop.onnx_runtime import OnnxModel

            return OnnxModel(weights, runtime=onnx if isinstance(onnx, str) else "onnxruntime")
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
        raise ModelArgumentError(f"{given}: {one_line(e, weights, path)}") from None


def _refuse_onnx(path: Path, given: str) -> None:
    if path.suffix.lower() == ".onnx":
        raise ModelArgumentError(
            f"{given}: an ONNX file, which only python -m vit.evaluate and python -m vit.predict "
            f"run; pass "
            f"the weights it was exported from (our .safetensors, a run folder, a transformers "
            f"folder)"
        )
