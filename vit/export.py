"""Hand a model on, verified: ONNX, a transformers folder, a torchvision state dict.

    python -m vit.export CHECKPOINT [--model NAME] [--pretrained [PATH]] [--onnx FILE] [--hf DIR]
        [--torchvision FILE]

CHECKPOINT is read as evaluate.py and `python -m vit.predict` read their --checkpoint
(`vit.factory.resolve_model`): a train.py run folder or a weights file in it, one of our
`.safetensors` files, a transformers folder, a weights file of another layout with --model
NAME, or a model name with --pretrained (timm's weights) or --pretrained PATH.
Every requested output is checked as possible before any is written (its location, the
optional package it needs, whether the format can hold this model); then each export is checked
before it is put in place: the written file is loaded by the library it is meant for
(onnxruntime, transformers `from_pretrained`, `torchvision.models.vit_*`), run on the same
random images as our model, and its logits must agree with ours to `--tolerance`
(max |theirs - ours| / max |ours|). A failed export leaves no file behind.

onnx, onnxruntime, onnxscript and transformers are optional: `pip install -e '.[interop]'`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import NON_NEGATIVE, ArgumentParser, add_model_arguments, number_in

FORMATS = ("onnx", "hf", "torchvision")  # the export flags, in the order they are written


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(  # a bad flag: one line, not the usage text
        prog="python -m vit.export",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser, positional=True)
    parser.add_argument("--onnx", type=Path, metavar="FILE", help="ONNX model, dynamic batch")
    parser.add_argument("--hf", type=Path, metavar="DIR", help="transformers folder")
    parser.add_argument("--torchvision", type=Path, metavar="FILE", help="torchvision state dict")
    parser.add_argument(
        "--tolerance", type=number_in(NON_NEGATIVE), default=1e-5, help="max relative logit diff"
    )
    return parser


if __name__ == "__main__":
    # `python -m vit.export`: --help and flag mistakes are answered before the imports below
    # load torch (seconds); main() reads the flags again, at no cost.
    build_parser().parse_args()

# ruff: noqa: E402  (the imports below come after the early answer above, on purpose)
import copy
import importlib
import json
from dataclasses import astuple, dataclass
from types import ModuleType

import torch
from safetensors.torch import save_file

from . import families
from .cli import unwritable
from .factory import class_names_for, model_from_flags
from .io import atomic_write, atomic_write_dir
from .layouts import hf_common, huggingface
from .layouts import torchvision as torchvision_layout
from .model import VisionTransformer

INSTALL_HINT = "pip install -e '.[interop]'"
ONNX_OPSET = 18
EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's 2 GB limit: bigger models keep weights aside


class MissingExtraError(ImportError):
    """An export needs a package of the `interop` extra that is not installed."""


@dataclass
class ExportCheck:
    """Where an export went and how closely the other library reproduced our logits."""

    path: Path
    target: str  # what ran the export, e.g. "onnxruntime", "torchvision.models.vit_b_16(...)"
    max_relative_difference: float
    compared: str = "logits"  # what was compared: "embeddings" for a headless ONNX export

    def __str__(self) -> str:
        return (
            f"wrote {self.path}; {self.target} {self.compared} vs ours: max relative difference "
            f"{self.max_relative_difference:.1e}"
        )


def require(module: str, purpose: str) -> ModuleType:
    """Import an optional package, or fail saying which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{purpose} needs the package {module!r}, which is not installed: {INSTALL_HINT}"
        ) from e


def input_size(model: VisionTransformer) -> tuple[int, int]:
    """(H, W) the model is exported for: a dynamic model's preprocessing size (a transformers
    DINOv2 folder keeps its 518-px grid and is fed 224 px), else its img_size."""
    if model.patch_embed.dynamic_img_size and model.preprocess is not None:
        return model.preprocess.input_size
    return model.patch_embed.img_size


def sample_images(model: VisionTransformer, batch: int, seed: int = 0) -> torch.Tensor:
    """Seeded random normalised images (B, C, H, W) of the model's input size."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, model.config.in_chans, *input_size(model), generator=generator)


def cpu_float32(model: VisionTransformer) -> VisionTransformer:
    """The model in eval mode on the CPU in float32: itself if it is already, else a copy (the
    caller's model is left where it is)."""
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
        model = copy.deepcopy(model).float().cpu()
    return model.eval()


@torch.no_grad()
def our_outputs(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """Logits (B, num_classes), or for a headless model the final tokens (B, N, D)."""
    return model(images) if model.num_classes else model.forward_features(images)


def relative_difference(theirs: torch.Tensor, ours: torch.Tensor) -> float:
    if theirs.shape != ours.shape:
        raise ValueError(
            f"output shape {tuple(theirs.shape)} differs from ours {tuple(ours.shape)}"
        )
    return ((theirs.float() - ours).abs().max() / ours.abs().max().clamp_min(1e-30)).item()


def check(difference: float, tolerance: float, target: str, compared: str = "logits") -> None:
    if not difference <= tolerance:  # also catches NaN
        raise ValueError(
            f"{target} does not reproduce our {compared}: max relative difference "
            f"{difference:.2e} > tolerance {tolerance:.0e}; nothing was written"
        )


# -- ONNX ----------------------------------------------------------------------------------------
def export_onnx(
    model: VisionTransformer, path: str | Path, tolerance: float = 1e-5, opset: int = ONNX_OPSET
) -> ExportCheck:
    """Export to ONNX with a dynamic batch size, then run it in onnxruntime at batch sizes 1 and
    3 and compare with our `model(x)`. Input `pixel_values` (B, C, H, W) normalised as
    `model.preprocess` says; output `logits` (B, num_classes), or for a headless model
    (num_classes=0) `embeddings` (B, D), its pooled features. Class names and preprocessing
    are stored in the model's metadata (`vit.class_names`, `vit.preprocess`)."""
    for module in ("onnx", "onnxscript"):
        require(module, "--onnx (torch.onnx's exporter)")
    onnxruntime = require("onnxruntime", "--onnx (verifying the export)")
    path = Path(path)
    model = cpu_float32(model)
    program = torch.onnx.export(
        model,
        (sample_images(model, 2),),
        dynamo=True,
        input_names=["pixel_values"],
        output_names=[onnx_output_name(model)],
        dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)}},
        opset_version=opset,
        verbose=False,
    )
    metadata = program.model.metadata_props
    metadata["vit.class_names"] = json.dumps(class_names_for(model))
    if model.preprocess is not None:
        metadata["vit.preprocess"] = json.dumps(model.preprocess.to_dict())
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES
    if large:  # the weights go to a .data file beside it: written in place, removed on failure
        try:
            program.save(str(path), external_data=True)
            return _verify_onnx(onnxruntime, path, model, tolerance)
        except BaseException:
            for written in (path, path.with_name(path.name + ".data")):
                written.unlink(missing_ok=True)
            raise
    result: list[ExportCheck] = []

    def write(tmp: Path) -> None:
        program.save(str(tmp), external_data=False)
        result.append(_verify_onnx(onnxruntime, tmp, model, tolerance))

    atomic_write(path, write)
    return ExportCheck(
        path, result[0].target, result[0].max_relative_difference, result[0].compared
    )


def onnx_output_name(model: VisionTransformer) -> str:
    """ "logits" for a classifier, "embeddings" for a headless model (its pooled features)."""
    return "logits" if model.num_classes else "embeddings"


def _verify_onnx(onnxruntime, path: Path, model: VisionTransformer, tolerance: float):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in (1, 3):  # two batch sizes: the batch axis really is dynamic
        images = sample_images(model, batch, seed=batch)
        (theirs,) = session.run([onnx_output_name(model)], {"pixel_values": images.numpy()})
        with torch.no_grad():
            ours = model(images)  # logits, or a headless model's pooled embedding
        worst = max(worst, relative_difference(torch.from_numpy(theirs), ours))
    check(worst, tolerance, "onnxruntime")
    return ExportCheck(path, "onnxruntime (batch 1 and 3)", worst, onnx_output_name(model))


# -- transformers --------------------------------------------------------------------------------
def export_transformers(
    model: VisionTransformer, folder: str | Path, tolerance: float = 1e-5
) -> ExportCheck:
    """Write a transformers folder (config.json with id2label, model.safetensors,
    preprocessor_config.json) of the class the model's family is written as (`vit.families`:
    ViTForImageClassification / ViTModel, ViTMAEModel, Dinov2Model, Dinov2WithRegistersModel,
    CLIPVisionModel(WithProjection), SiglipVisionModel, DeiTForImageClassificationWithTeacher)
    and check that transformers' `from_pretrained` of that class reproduces our outputs: logits,
    pooled embeddings, or the final tokens, as the class returns them."""
    transformers = require("transformers", "--hf (verifying the export)")
    folder = Path(folder)
    model = cpu_float32(model)
    config = huggingface.config_to_hf(model.config, class_names_for(model), model.model_name)
    tensors = huggingface.state_to_hf(model.state_dict(), model.config, model.model_name)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    result: list[ExportCheck] = []

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), {"format": "pt"})
        if model.preprocess is not None:
            processor = hf_common.preprocess_to_hf(model.preprocess)
            (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
        result.append(_verify_transformers(transformers, tmp, model, config, tolerance))

    atomic_write_dir(folder, write)
    return ExportCheck(folder, *astuple(result[0])[1:])


# a transformers output -> what it holds, in ExportCheck's words
COMPARED = dict(
    logits="logits",
    image_embeds="embeddings",
    pooler_output="embeddings",
    last_hidden_state="final tokens",
)


def _verify_transformers(transformers, folder: Path, model, config: dict, tolerance: float):
    """Load `folder` as the class config.json names and compare its output with ours."""
    (name,) = config["architectures"]
    family = families.family_of(model)
    output = family.hf_class(model.num_classes).output
    kwargs = {"add_pooling_layer": False} if name == "ViTModel" else {}
    theirs = getattr(transformers, name).from_pretrained(str(folder), **kwargs).eval()
    if "id2label" in config and model.num_classes:
        names = [theirs.config.id2label[i] for i in range(model.num_classes)]
        if names != [config["id2label"][str(i)] for i in range(model.num_classes)]:
            raise ValueError("transformers read other class names than were written")
    images = sample_images(model, 2)
    inputs = {"pixel_values": images}
    if name == "ViTMAEModel":  # no masking (mask_ratio 0), and the patches kept in order
        inputs["noise"] = torch.arange(model.patch_embed.num_patches, dtype=torch.float32)
        inputs["noise"] = inputs["noise"].expand(len(images), -1)
    with torch.no_grad():
        outputs = theirs(**inputs)
        if getattr(outputs, output) is None:  # a SigLIP tower without its pooling head
            output = "last_hidden_state"
        found = getattr(outputs, output)
        ours = model.forward_features(images) if output == "last_hidden_state" else model(images)
    target = f"transformers {name}"
    difference = relative_difference(found, ours)
    check(difference, tolerance, target, COMPARED[output])
    return ExportCheck(folder, target, difference, COMPARED[output])


# -- torchvision ---------------------------------------------------------------------------------
def export_torchvision(
    model: VisionTransformer, path: str | Path, tolerance: float = 1e-5
) -> ExportCheck:
    """Write a state dict for torchvision's `VisionTransformer` and check it: loaded strictly
    into `torchvision.models.vit_b_16` & co when the architecture is one of theirs (else into
    `torchvision.models.VisionTransformer(...)` of the same shape), same logits. Models it
    cannot express (mean pooling, no class token, ...) are refused, naming why."""
    import torchvision  # a core dependency

    path = Path(path)
    model = cpu_float32(model)
    builder, kwargs = torchvision_layout.constructor_args(model.config)
    state = torchvision_layout.from_timm(model.state_dict())
    state = {k: v.detach().contiguous() for k, v in state.items()}
    if builder is not None:
        build = getattr(torchvision.models, builder)
        arch = dict(image_size=kwargs["image_size"], num_classes=kwargs["num_classes"])
        target = f"torchvision.models.{builder}"
    else:
        build, arch = torchvision.models.VisionTransformer, kwargs
        target = "torchvision.models.VisionTransformer"
    result: list[ExportCheck] = []

    def write(tmp: Path) -> None:
        torch.save(state, tmp)
        with torch.device("meta"):  # no random init of weights that are loaded next
            theirs = build(**arch)
        theirs.load_state_dict(torch.load(tmp, weights_only=True), strict=True, assign=True)
        images = sample_images(model, 2)
        with torch.no_grad():
            difference = relative_difference(theirs.eval()(images), our_outputs(model, images))
        check(difference, tolerance, target)
        result.append(ExportCheck(path, f"{target}({_call_args(arch)})", difference))

    atomic_write(path, write)
    return result[0]


def _call_args(kwargs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


# -- command line --------------------------------------------------------------------------------
def location_problems(targets: list[tuple[str, Path]]) -> list[str]:
    """Why an output could not be written at the end (a folder where a file goes, no write
    permission, one path named twice), found before anything is loaded or written."""
    problems = [unwritable(f"--{flag}", path, flag == "hf") for flag, path in targets]
    seen: dict[Path, str] = {}
    for flag, path in targets:
        key = path.resolve()
        if key in seen:
            problems.append(f"--{flag} {path}: --{seen[key]} writes there too; give two paths")
        seen[key] = flag
    return [problem for problem in problems if problem]


def format_problem(flag: str, model: VisionTransformer) -> str | None:
    """Why the format of --`flag` cannot be made for this model (the optional package it needs
    is missing, or the format cannot hold the model), None if it can."""
    try:
        if flag == "onnx":
            for module in ("onnx", "onnxscript", "onnxruntime"):
                require(module, "--onnx (export and verification)")
        elif flag == "hf":
            require("transformers", "--hf (verifying the export)")
            huggingface.config_to_hf(model.config, class_names_for(model), model.model_name)
        else:
            torchvision_layout.constructor_args(model.config)
    except (MissingExtraError, ValueError) as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    targets = [(flag, getattr(args, flag)) for flag in FORMATS if getattr(args, flag) is not None]
    if not targets:
        parser.error("nothing to do: pass --onnx FILE, --hf DIR and/or --torchvision FILE")
    for problem in location_problems(targets):
        parser.error(problem)
    try:
        model = model_from_flags(args, source="CHECKPOINT")
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Every output is checked as possible before the first is written: no half-done export.
    refused = [(flag, path, format_problem(flag, model)) for flag, path in targets]
    refused = [(flag, path, problem) for flag, path, problem in refused if problem]
    for flag, path, problem in refused:
        print(f"error: --{flag} {path}: {problem}; nothing was written", file=sys.stderr)
    if refused:
        return 2
    exporters = {"onnx": export_onnx, "hf": export_transformers, "torchvision": export_torchvision}
    failed = 0
    for flag, path in targets:
        try:
            print(f"--{flag}: {exporters[flag](model, path, tolerance=args.tolerance)}")
        except (MissingExtraError, ValueError, OSError) as e:
            print(f"error: --{flag} {path}: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
