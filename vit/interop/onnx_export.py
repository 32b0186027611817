"""Exporting a model to ONNX: any batch and input size, our metadata, onnxruntime's transformer
fusions (--optimize) and int8 matrix products (--int8), each checked against our model."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import shutil
import sys
from dataclasses import astuple, dataclass
from pathlib import Path

import torch

from ..models.class_names import class_names_for
from ..models.vision_transformer import VisionTransformer
from ..utils.files import atomic_write, atomic_write_files
from .export_check import (
    ExportCheck,
    MissingExtraError,
    check,
    cpu_float32,
    input_size,
    relative_difference,
    require,
    sample_images,
)

# 23: scaled_dot_product_attention exports as ONNX's own Attention operator, one per block,
# which onnxruntime (1.23 on) runs as one fused kernel: 1.1x (float32) to 1.3x (int8) opset 18's
# decomposed MatMul-Softmax-MatMul on ViT-S/16 (docs/fast-inference.md)
ONNX_OPSET = 23


EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's 2 GB limit: bigger models keep weights aside


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


# Static int8: calibration images run through the float graph this many at a time (onnxruntime's
# MinMax calibration keeps only each tensor's minimum and maximum per batch)
CALIBRATION_BATCH = 16


@dataclass
class OnnxOptions:
    """How `export_onnx` builds the graph: dynamic height and width (else the model's fixed input
    size), onnxruntime's transformer fusions, int8 matrix products: dynamic (activations
    quantized at run time), or static where `calibration` images (N, C, H, W), prepared as
    `model.preprocess` says, fix each activation's range at export."""

    dynamic_size: bool = True
    optimize: bool = False
    int8: bool = False
    int8_tolerance: float = INT8_TOLERANCE
    calibration: torch.Tensor | None = None


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
    (num_classes=0) `embeddings`: its pooled features (B, D), or a model without pooling's tokens
    (B, N, D). The metadata holds `vit.class_names`,
    `vit.preprocess`, `vit.model_name`, `vit.precision` ("float32" or "int8") and
    `vit.output` ("logits" or "embeddings"), each a JSON string. `options.optimize` applies
    onnxruntime's transformer fusions (their counts are in the result); `options.int8` quantizes the
    MatMul and Gemm weights to int8 per channel (dynamic activations), checked to
    `int8_tolerance`."""
    options = options or OnnxOptions()
    onnxruntime = require_onnx_packages(opset)
    if options.calibration is not None and not options.int8:
        raise ValueError("calibration images calibrate --int8's activations: pass --int8 too")
    path = Path(path)
    model = cpu_float32(model)
    notes = []
    if options.dynamic_size and model.config.pos_embed_resample == "dinov2":
        # Its scale-factor resampling traces to a Resize whose output size is fixed at export
        # (onnxruntime then fails at any other size): such a model is exported at its own size.
        options = dataclasses.replace(options, dynamic_size=False)
        notes.append("fixed size: the original DINOv2's scale-factor resampling is not dynamic")
    if options.dynamic_size and any(model.patch_embed.margin):
        # a dynamic size is a multiple of the patch, which this model's own size is not
        options = dataclasses.replace(options, dynamic_size=False)
        notes.append("fixed size: the patches leave a margin of the model's input size")
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
    result: list[ExportCheck] = []
    # Past protobuf's limit the weights go to FILE.data, which FILE names: both checked, then put
    # in place together
    if large:
        if options.optimize or options.int8:
            raise ValueError("--optimize and --int8 take models under 1.8 GB of float32 weights")

        def write_both(folder: Path) -> None:
            program.save(str(folder / path.name), external_data=True)
            result.append(_verify_onnx(onnxruntime, folder / path.name, model, tolerance))

        atomic_write_files([path, path.with_name(path.name + ".data")], write_both)
        return ExportCheck(path, *astuple(result[0])[1:])

    def write(tmp: Path) -> None:
        program.save(str(tmp), external_data=False)
        if options.optimize:
            notes.append(optimize_onnx(tmp, model))
        check = _verify_onnx(onnxruntime, tmp, model, tolerance)
        if options.int8:
            check = quantize_checked(tmp, model, options)
        check.target += "".join(f"; {note}" for note in notes)
        result.append(check)

    atomic_write(path, write)
    return ExportCheck(path, *astuple(result[0])[1:])


def require_onnx_packages(opset: int = ONNX_OPSET):
    """onnx, onnxscript and an onnxruntime that runs `opset`, or MissingExtraError naming what
    to install; returns onnxruntime."""
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
    return onnxruntime


def dynamic_size_copy(model: VisionTransformer) -> VisionTransformer:
    """The model taking any multiple of its patch size (a shallow copy sharing the weights); a
    model whose patches leave a margin of its own size stays as it is, fixed at that size."""
    if model.patch_embed.dynamic_img_size or any(model.patch_embed.margin):
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
    """The file's description of itself, each value a JSON string (read by
    vit.interop.onnx_runtime)."""
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


def quantize_checked(path: Path, model: VisionTransformer, options: OnnxOptions) -> ExportCheck:
    """`quantize_onnx` of the float file at `path` in place (static with `options.calibration`),
    then its outputs checked against ours to `options.int8_tolerance`."""
    quantize_onnx(path, model, options.calibration)
    onnxruntime = require("onnxruntime", "--int8 (verifying the export)")
    tolerance, samples = options.int8_tolerance, options.calibration
    return _verify_onnx(onnxruntime, path, model, tolerance, int8=True, samples=samples)


def quantized_copy(
    float_path: Path, path: Path, model: VisionTransformer, options: OnnxOptions
) -> ExportCheck:
    """An int8 file at `path` made from the float export at `float_path` (of `model`) without
    exporting again, checked as `export_onnx` checks its own; nothing written on failure."""
    result: list[ExportCheck] = []

    def write(tmp: Path) -> None:
        shutil.copyfile(float_path, tmp)
        result.append(quantize_checked(tmp, dynamic_size_copy(cpu_float32(model)), options))

    atomic_write(path, write)
    return ExportCheck(path, *astuple(result[0])[1:])


def quantize_onnx(
    path: Path, model: VisionTransformer, calibration: torch.Tensor | None = None
) -> None:
    """Quantize the MatMul and Gemm weights of the file at `path` to int8, per output channel,
    in place. Without `calibration` their activations are quantized at run time (dynamic); with
    calibration images (N, C, H, W) each activation's range is measured on them once (MinMax)
    and stored (static: QuantizeLinear/DequantizeLinear pairs around each product, per tensor,
    which onnxruntime runs as int8 products and OpenVINO reads as an int8 model). LayerNorm,
    attention (the fused operator), GELU and the residual sums stay float32 either way. QInt8
    weights: the signed layout onnxruntime's x86 int8 kernels (VNNI and AVX2) take with uint8
    activations."""
    quantization = require("onnxruntime.quantization", "--int8")
    source = path.with_name(path.name + ".float.onnx")
    path.replace(source)
    common = dict(
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=True,
        weight_type=quantization.QuantType.QInt8,
        # 7-bit weights: x86 CPUs without VNNI multiply uint8 by int8 in pairs whose sums
        # saturate at 16 bits (AVX2's vpmaddubsw); there the shipped CIFAR model lost 0.40
        # points with 8-bit weights and 0.07 with 7-bit (docs/fast-inference.md)
        reduce_range=True,
    )
    try:
        # quantize_* log a suggestion to preprocess the graph first (shape inference, which
        # does not know opset 23's Attention): the check after it says whether it worked
        with _logging_quiet():
            if calibration is None:
                quantization.quantize_dynamic(str(source), str(path), **common)
            else:
                quantization.quantize_static(
                    str(source),
                    str(path),
                    CalibrationImages(calibration),
                    quant_format=quantization.QuantFormat.QDQ,
                    activation_type=quantization.QuantType.QUInt8,
                    calibrate_method=quantization.CalibrationMethod.MinMax,
                    **common,
                )
    finally:
        source.unlink(missing_ok=True)
    set_onnx_metadata(path, onnx_metadata(model, "int8"))


class CalibrationImages:
    """onnxruntime's calibration reader over images (N, C, H, W): CALIBRATION_BATCH at a time."""

    def __init__(self, images: torch.Tensor) -> None:
        self.batches = list(images.float().split(CALIBRATION_BATCH))

    def get_next(self) -> dict | None:
        return {"pixel_values": self.batches.pop(0).numpy()} if self.batches else None


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
    onnxruntime,
    path: Path,
    model: VisionTransformer,
    tolerance: float,
    int8: bool = False,
    samples: torch.Tensor | None = None,
) -> ExportCheck:
    """Run the file at `path` on random images, or on `samples` (N, C, H, W) resized to each
    checked size (a static int8 file is checked on images like its calibration's: its stored
    activation ranges were measured on them, not on noise), and compare with `model`."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst, agree, total = 0.0, 0, 0
    sizes = onnx_check_sizes(model, session)
    for size in sizes:
        for batch in (1, 3):  # two batch sizes: the batch axis really is dynamic
            generator = torch.Generator().manual_seed(batch)
            if samples is None:
                images = torch.randn(batch, model.config.in_chans, *size, generator=generator)
            else:
                chosen = samples[torch.randperm(len(samples), generator=generator)[:batch]]
                images = torch.nn.functional.interpolate(chosen.float(), size, mode="bilinear")
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
