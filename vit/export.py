"""Hand a model on, verified: ONNX, a transformers folder, a torchvision state dict.

    python -m vit.export CHECKPOINT [--model NAME] [--pretrained [PATH]] [--onnx FILE
        [--static-size] [--optimize] [--int8]] [--hf DIR] [--torchvision FILE]

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
The ONNX graph takes any batch and any height and width that are multiples of the patch size
(the position embeddings are resampled inside it; --static-size fixes the model's size);
--optimize applies onnxruntime's transformer fusions and reports their counts; --int8 stores
int8 matrix products (checked to --int8-tolerance, as int8 cannot meet 1e-5). See
docs/fast-inference.md.

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
    parser.add_argument(
        "--onnx", type=Path, metavar="FILE", help="ONNX model, dynamic batch, height and width"
    )
    parser.add_argument(
        "--static-size", action="store_true", help="ONNX: fix height and width to the model's"
    )
    parser.add_argument(
        "--optimize", action="store_true", help="ONNX: onnxruntime's transformer fusions"
    )
    parser.add_argument(
        "--int8", action="store_true", help="ONNX: int8 matrix products (dynamic quantization)"
    )
    parser.add_argument(
        "--int8-tolerance",
        type=number_in(NON_NEGATIVE),
        default=0.1,
        help="--int8: max relative logit difference to float32 (default 0.1)",
    )
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
import contextlib
import copy
import dataclasses
import functools
import importlib
import io
import json
import logging
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
# 23: scaled_dot_product_attention exports as ONNX's own Attention operator, one per block,
# which onnxruntime (1.23 on) runs as one fused kernel: 1.1x (float32) to 1.3x (int8) opset 18's
# decomposed MatMul-Softmax-MatMul on ViT-S/16 (docs/fast-inference.md)
ONNX_OPSET = 23
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
# What `--optimize` should fuse, per transformer block: a fusion whose count stays below the block
# count did not match this export (onnxruntime's fusions fail silently on unfamiliar patterns).
# Attention: opset 23's own operator (the exporter's) or onnxruntime's fused ones. The residual
# sum with the LayerNorm after it: onnxruntime's SkipLayerNormalization.
ATTENTION_FUSIONS = ("Attention", "MultiHeadAttention")
SKIP_LAYER_NORM_FUSIONS = ("SkipLayerNormalization", "SkipSimplifiedLayerNorm")
GELU_FUSIONS = ("Gelu", "FastGelu", "BiasGelu")
# int8 logits cannot meet 1e-5: the default bound on their max relative difference to ours,
# measured (tests, benchmarks/onnx_throughput.py) at 0.01-0.04 on random images and models.
INT8_TOLERANCE = 0.1


@dataclass
class OnnxOptions:
    """How `export_onnx` builds the graph: dynamic height and width (else the model's fixed input
    size), onnxruntime's transformer fusions, dynamic int8 matrix products."""

    dynamic_size: bool = True
    optimize: bool = False
    int8: bool = False
    int8_tolerance: float = INT8_TOLERANCE


def export_onnx(
    model: VisionTransformer,
    path: str | Path,
    tolerance: float = 1e-5,
    opset: int = ONNX_OPSET,
    options: OnnxOptions | None = None,
) -> ExportCheck:
    """Export to ONNX with a dynamic batch size and, by default, a dynamic height and width (any
    multiple of the patch size: the position embeddings are resampled inside the graph, by an
    ONNX Resize that onnxruntime runs), then run it in onnxruntime and compare with our
    `model(x)` (batch 1 and 3; with a dynamic size also at a second image size, against our
    model with `dynamic_img_size`). Input `pixel_values` (B, C, H, W) float32, normalised as
    `model.preprocess` says; output `logits` (B, num_classes), or for a headless model
    (num_classes=0) `embeddings` (B, D), its pooled features. The metadata holds `vit.class_names`,
    `vit.preprocess`, `vit.model_name`, `vit.precision` ("float32" or "int8") and `vit.output`
    ("logits" or "embeddings"), each a JSON string. `options.optimize` applies onnxruntime's
    transformer fusions (their counts are in the result); `options.int8` quantizes the MatMul
    and Gemm weights to int8 per channel (dynamic activations), checked to `int8_tolerance`."""
    options = options or OnnxOptions()
    for module in ("onnx", "onnxscript"):
        require(module, "--onnx (torch.onnx's exporter)")
    onnxruntime = require("onnxruntime", "--onnx (verifying the export)")
    from packaging.version import Version  # a dependency of onnxruntime, imported above

    if opset >= 23 and Version(onnxruntime.__version__).release < (1, 23):
        raise MissingExtraError(
            f"--onnx writes opset {opset}, whose Attention operator onnxruntime runs from 1.23 "
            f"on; this is onnxruntime {onnxruntime.__version__}: pip install -U "
            f"'onnxruntime>=1.23'"
        )
    path = Path(path)
    model = cpu_float32(model)
    notes = []
    if options.dynamic_size and model.config.pos_embed_resample == "dinov2":
        # Its scale-factor resampling traces to a Resize whose output size is fixed at export
        # (onnxruntime then fails at any other size): such a model is exported at its own size.
        options = dataclasses.replace(options, dynamic_size=False)
        notes.append("fixed size: the original DINOv2's scale-factor resampling is not dynamic")
    if options.dynamic_size:
        model = dynamic_size_copy(model)
    program = torch.onnx.export(
        model,
        (export_sample(model, options.dynamic_size),),
        dynamo=True,
        input_names=["pixel_values"],
        output_names=[onnx_output_name(model)],
        dynamic_shapes={"x": onnx_dynamic_axes(model, options.dynamic_size)},
        opset_version=opset,
        verbose=False,
    )
    program.model.metadata_props.update(onnx_metadata(model, "float32"))
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES
    if large:  # the weights go to a .data file beside it: written in place, removed on failure
        if options.optimize or options.int8:
            raise ValueError("--optimize and --int8 take models under 1.8 GB of float32 weights")
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
        if options.optimize:
            notes.append(optimize_onnx(tmp, model))
        check = _verify_onnx(onnxruntime, tmp, model, tolerance)
        if options.int8:
            quantize_onnx(tmp, model)
            check = _verify_onnx(onnxruntime, tmp, model, options.int8_tolerance, int8=True)
        check.target += "".join(f"; {note}" for note in notes)
        result.append(check)

    atomic_write(path, write)
    return ExportCheck(path, *astuple(result[0])[1:])


def dynamic_size_copy(model: VisionTransformer) -> VisionTransformer:
    """The model taking any multiple of its patch size (a shallow copy sharing the weights)."""
    if model.patch_embed.dynamic_img_size:
        return model
    dynamic = copy.copy(model)
    dynamic._modules = dict(model._modules)
    dynamic.patch_embed = copy.copy(model.patch_embed)
    dynamic.patch_embed.dynamic_img_size = True
    return dynamic


def export_sample(model: VisionTransformer, dynamic_size: bool) -> torch.Tensor:
    """Images (2, C, H, W) traced by the exporter. With a dynamic size: a non-square grid one and
    two patches bigger than the model's, so that the traced forward takes the branch that
    resamples the position embeddings (at the model's own size it is skipped)."""
    if not dynamic_size:
        return sample_images(model, 2)
    (gh, gw), (ph, pw) = model.patch_embed.grid_size, model.patch_embed.patch_size
    return torch.randn(2, model.config.in_chans, (gh + 1) * ph, (gw + 2) * pw)


def onnx_dynamic_axes(model: VisionTransformer, dynamic_size: bool) -> dict[int, object]:
    """torch.export's dynamic axes of `pixel_values`: the batch, and height and width as
    multiples of the patch size."""
    axes: dict[int, object] = {0: torch.export.Dim("batch", min=1)}
    if dynamic_size:
        ph, pw = model.patch_embed.patch_size
        axes[2] = ph * torch.export.Dim("grid_height", min=1, max=1024)
        axes[3] = pw * torch.export.Dim("grid_width", min=1, max=1024)
    return axes


def onnx_metadata(model: VisionTransformer, precision: str) -> dict[str, str]:
    """The file's description of itself, each value a JSON string (read by vit.onnx_model)."""
    metadata = {
        "vit.class_names": json.dumps(class_names_for(model)),
        "vit.model_name": json.dumps(model.model_name),
        "vit.precision": json.dumps(precision),
        "vit.output": json.dumps(onnx_output_name(model)),
    }
    if model.preprocess is not None:
        metadata["vit.preprocess"] = json.dumps(model.preprocess.to_dict())
    return metadata


def set_onnx_metadata(path: Path, metadata: dict[str, str]) -> None:
    """Write `metadata` into the ONNX file at `path` (the optimizer and quantizer drop it)."""
    onnx = require("onnx", "--onnx")
    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


@contextlib.contextmanager
def _logging_quiet():
    """No log record below ERROR while inside."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def optimize_onnx(path: Path, model: VisionTransformer) -> str:
    """Apply onnxruntime's transformer fusions to the file at `path`, in place; return the fused
    operator counts, and print a warning for each fusion that matched fewer than one per block."""
    optimizer = require("onnxruntime.transformers.optimizer", "--optimize")
    # Its symbolic shape inference does not know opset 23's Attention and says so in several
    # lines (a print and warnings); what that costs (a fusion that misses) is warned below.
    with contextlib.redirect_stdout(io.StringIO()), _logging_quiet():
        optimized = optimizer.optimize_model(
            str(path),
            model_type="vit",
            num_heads=model.config.num_heads,
            hidden_size=model.config.embed_dim,
            opt_level=0,  # the graph fusions only: the session applies its own at load time
        )
    counts = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    optimized.save_model_to_file(str(path))
    set_onnx_metadata(path, onnx_metadata(model, "float32"))
    depth = model.config.depth
    expected = {"attention": ATTENTION_FUSIONS, "residual + LayerNorm": SKIP_LAYER_NORM_FUSIONS}
    if model.config.act_layer in ("gelu", "gelu_tanh"):  # QuickGELU has no fused operator
        expected["GELU"] = GELU_FUSIONS
    for what, operators in expected.items():
        found = sum(counts.get(op, 0) for op in operators)
        if found < depth:
            print(
                f"warning: --optimize fused {found} {what} operators for {depth} blocks: "
                f"onnxruntime's {what} fusion did not match this export",
                file=sys.stderr,
            )
    return "fused " + ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))


def quantize_onnx(path: Path, model: VisionTransformer) -> None:
    """Quantize the MatMul and Gemm weights of the file at `path` to int8, per output channel,
    in place; activations are quantized at run time (dynamic), LayerNorm, softmax, GELU and the
    residual sums stay float32. QInt8 weights: the signed layout onnxruntime's x86 int8 kernels
    (VNNI and AVX2) take with uint8 activations."""
    quantization = require("onnxruntime.quantization", "--int8")
    source = path.with_name(path.name + ".float.onnx")
    path.replace(source)
    try:
        quantization.quantize_dynamic(
            str(source),
            str(path),
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=True,
            weight_type=quantization.QuantType.QInt8,
        )
    finally:
        source.unlink(missing_ok=True)
    set_onnx_metadata(path, onnx_metadata(model, "int8"))


def onnx_output_name(model: VisionTransformer) -> str:
    """ "logits" for a classifier, "embeddings" for a headless model (its pooled features)."""
    return "logits" if model.num_classes else "embeddings"


def onnx_check_sizes(model: VisionTransformer, session) -> list[tuple[int, int]]:
    """Image sizes (H, W) to check a session at: the model's, and for a graph with a dynamic
    height and width also a non-square grid of other patch counts."""
    sizes = [input_size(model)]
    if any(isinstance(side, str) or side is None for side in session.get_inputs()[0].shape[2:]):
        (h, w), (ph, pw) = sizes[0], model.patch_embed.patch_size
        sizes.append((h + 2 * ph, max(w - pw, pw)))
    return sizes


def _verify_onnx(
    onnxruntime, path: Path, model: VisionTransformer, tolerance: float, int8: bool = False
) -> ExportCheck:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst, agree, total = 0.0, 0, 0
    sizes = onnx_check_sizes(model, session)
    for size in sizes:
        for batch in (1, 3):  # two batch sizes: the batch axis really is dynamic
            generator = torch.Generator().manual_seed(batch)
            images = torch.randn(batch, model.config.in_chans, *size, generator=generator)
            (theirs,) = session.run([onnx_output_name(model)], {"pixel_values": images.numpy()})
            with torch.no_grad():
                ours = model(images)  # logits, or a headless model's pooled embedding
            theirs = torch.from_numpy(theirs)
            worst = max(worst, relative_difference(theirs, ours))
            agree += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
            total += batch
    target = "onnxruntime int8" if int8 else "onnxruntime"
    check(worst, tolerance, target, onnx_output_name(model))
    shown = ", ".join(f"{h}x{w}" for h, w in sizes)
    target += f" (batch 1 and 3 at {shown}"
    if int8 and model.num_classes:
        target += f"; top-1 agreement {agree}/{total}"
    return ExportCheck(path, target + ")", worst, onnx_output_name(model))


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
    onnx_only = [flag for flag in ("static_size", "optimize", "int8") if getattr(args, flag)]
    if onnx_only and args.onnx is None:
        flag = "--" + onnx_only[0].replace("_", "-")
        parser.error(f"{flag} shapes the ONNX export: pass --onnx FILE too; nothing was written")
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
    options = OnnxOptions(
        dynamic_size=not args.static_size,
        optimize=args.optimize,
        int8=args.int8,
        int8_tolerance=args.int8_tolerance,
    )
    exporters = {
        "onnx": functools.partial(export_onnx, options=options),
        "hf": export_transformers,
        "torchvision": export_torchvision,
    }
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
