"""The ways to run one model for inference on a CPU, timed side by side: which is fastest here.

A path is the PyTorch model in float32 or with bfloat16 weights (`--model-dtype bfloat16`), or
its ONNX export run by onnxruntime (float32; int8 with activations quantized at run time; static
int8, calibrated on images) or by OpenVINO (float32; bfloat16; the static int8 file). Which is
fastest depends on the CPU's instruction sets more than on anything else (bfloat16 is emulated
and slow without AVX512-BF16 or AMX; int8 products gain most with VNNI), so it is measured on
the machine, never assumed: `time_paths` runs every path in alternating rounds, so that a load
drifting on the machine hits all alike, and reports each path's median round.
"""

from __future__ import annotations

import copy
import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..interop.export_check import INSTALL_HINT, OPENVINO_HINT
from ..interop.onnx_export import OnnxOptions, export_onnx, quantized_copy
from ..interop.onnx_runtime import OnnxModel
from ..models.vision_transformer import VisionTransformer
from .precision import fast_bfloat16

# The ONNX files, by kind: file name, and the flags of `python -m vit.export` that add to --onnx
ONNX_FILES = {
    "float32": ("model.onnx", ""),
    "int8": ("model-int8.onnx", " --int8"),
    "static": ("model-int8-static.onnx", " --int8 --calibration DATA"),
}
# label, runtime, file kind, compute dtype. OpenVINO runs the static int8 file as int8 (it reads
# its QuantizeLinear/DequantizeLinear pairs); the dynamic one it runs in float, slowly.
ONNX_PATHS = (
    ("onnxruntime float32", "onnxruntime", "float32", torch.float32),
    ("onnxruntime int8", "onnxruntime", "int8", torch.float32),
    ("onnxruntime int8 static", "onnxruntime", "static", torch.float32),
    ("OpenVINO float32", "openvino", "float32", torch.float32),
    ("OpenVINO bfloat16", "openvino", "float32", torch.bfloat16),
    ("OpenVINO int8 static", "openvino", "static", torch.float32),
)
NO_BF16 = "bfloat16 is emulated on this CPU (neither AVX512-BF16 nor AMX): slower than float32"


@dataclass
class InferencePath:
    """One way to run the model: `run` maps a batch (B, C, H, W) float32 to outputs (B, K);
    `export` the flags of `python -m vit.export SRC` that make its file (None: the weights as
    they are), `flags` what evaluate.py and `vit.predict` add to run it; `skipped` why it is
    not timed on this machine (then `run` is None)."""

    label: str
    run: Callable[[np.ndarray], torch.Tensor] | None
    export: str | None
    flags: str
    skipped: str = ""


def cpu_paths(
    model: VisionTransformer,
    folder: Path,
    calibration: torch.Tensor | None = None,
    log: Callable[[str], None] = print,
) -> list[InferencePath]:
    """Every inference path of `model` (float32, on the CPU), runnable or with the reason it
    is not here; the ONNX files are exported into `folder`, each checked against the model as
    `vit.export` checks it (`log` hears each one's result). `calibration`: images
    (N, C, H, W), prepared as the model's input, for the static int8 file (skipped without)."""
    native_bf16 = fast_bfloat16(torch.device("cpu"))
    paths = [
        InferencePath("PyTorch float32", _torch_runner(model), None, ""),
        InferencePath("PyTorch bfloat16", None, None, "--model-dtype bfloat16", NO_BF16),
    ]
    if native_bf16:
        paths[1].run, paths[1].skipped = _torch_runner(copy.deepcopy(model).bfloat16()), ""
    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if not _installed(m)]
    files, failed = _export_files(model, folder, calibration, log) if not missing else ({}, {})
    for label, runtime, kind, dtype in ONNX_PATHS:
        name, export_flags = ONNX_FILES[kind]
        flags = f"--checkpoint {name}" + (" --runtime openvino" if runtime == "openvino" else "")
        flags += " --model-dtype bfloat16" if dtype == torch.bfloat16 else ""
        path = InferencePath(label, None, f"--onnx {name}{export_flags}", flags)
        if missing:
            path.skipped = f"needs {', '.join(missing)}: {INSTALL_HINT}"
        elif runtime == "openvino" and not _installed("openvino"):
            path.skipped = f"OpenVINO is not installed: {OPENVINO_HINT}"
        elif dtype == torch.bfloat16 and not native_bf16:
            path.skipped = NO_BF16
        elif kind in failed:
            path.skipped = failed[kind]
        elif kind not in files:
            path.skipped = "static int8 needs calibration images: pass --data"
        else:
            path.run = _onnx_runner(OnnxModel(files[kind], runtime=runtime).to(dtype))
        paths.append(path)
    return paths


def _export_files(
    model: VisionTransformer,
    folder: Path,
    calibration: torch.Tensor | None,
    log: Callable[[str], None],
) -> tuple[dict[str, Path], dict[str, str]]:
    """The ONNX files by kind (the float export, and int8 copies quantized from it), and why
    each int8 kind that failed its check was not written."""
    float_file = folder / ONNX_FILES["float32"][0]
    log(f"  {float_file.name}: {export_onnx(model, float_file)}")
    files, failed = {"float32": float_file}, {}
    kinds = {"int8": OnnxOptions(int8=True)}
    if calibration is not None:
        kinds["static"] = OnnxOptions(int8=True, calibration=calibration)
    for kind, options in kinds.items():
        name = ONNX_FILES[kind][0]
        try:
            check = quantized_copy(float_file, folder / name, model, options)
            files[kind] = check.path
            log(f"  {name}: {check}")
        except ValueError as e:  # int8 too far from float32 for this model: not a path here
            failed[kind] = f"its export failed its check: {e}"
            log(f"  {name}: {e}")
    return files, failed


def cpu_flags() -> str:
    """The vector instruction sets of this CPU that decide the fastest path (from
    /proc/cpuinfo), e.g. "avx2 avx512f avx512_vnni avx512_bf16"."""
    flags = _cpuinfo("flags").split()
    if not flags:
        return "unknown"
    return " ".join(flag for flag in CPU_FLAGS if flag in flags) or "none of " + " ".join(CPU_FLAGS)


def cpu_name() -> str:
    """This CPU's model name, family and model number, e.g. "AMD EPYC (family 25, model 1)"."""
    name = _cpuinfo("model name") or "an unknown CPU"
    family, number = _cpuinfo("cpu family"), _cpuinfo("model")
    return f"{name} (family {family}, model {number})" if family else name


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def _cpuinfo(key: str) -> str:
    """The first value of `key` in /proc/cpuinfo, "" where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return ""


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _torch_runner(model: torch.nn.Module) -> Callable[[np.ndarray], torch.Tensor]:
    def run(batch: np.ndarray) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.from_numpy(batch)).float()

    return run


def _onnx_runner(model: OnnxModel) -> Callable[[np.ndarray], torch.Tensor]:
    return lambda batch: model(torch.from_numpy(batch))


def time_paths(
    run: dict[str, Callable[[np.ndarray], object]],
    batch: np.ndarray,
    rounds: int = 3,
    round_seconds: float = 0.5,
) -> dict[str, float]:
    """Label -> images/s of its median round (see `time_rounds`)."""
    timed = time_rounds(run, batch, rounds, round_seconds)
    return {label: statistics.median(speeds) for label, speeds in timed.items()}


def time_rounds(
    run: dict[str, Callable[[np.ndarray], object]],
    batch: np.ndarray,
    rounds: int = 3,
    round_seconds: float = 0.5,
) -> dict[str, list[float]]:
    """Label -> images/s of each round, the paths taking turns round by round; each path's
    calls per round are set from one timed call (after a warm-up call) so that a round lasts
    about `round_seconds`, at least one call."""
    calls = {}
    with torch.inference_mode():
        for label, fn in run.items():
            fn(batch)  # warm-up: the first call picks kernels and allocates
            start = time.perf_counter()
            fn(batch)
            calls[label] = max(1, round(round_seconds / (time.perf_counter() - start)))
        seconds: dict[str, list[float]] = {label: [] for label in run}
        for _ in range(rounds):
            for label, fn in run.items():
                start = time.perf_counter()
                for _ in range(calls[label]):
                    fn(batch)
                seconds[label].append((time.perf_counter() - start) / calls[label])
    return {label: [len(batch) / t for t in s] for label, s in seconds.items()}


# A path whose rounds differ more than this (fastest / slowest) was timed on a machine whose load
# or clock changed under it: on a shared 2-core host PyTorch's two threads ran 122-1,613 images/s
# from one round to the next, and the ranking that followed was noise.
STEADY_SPREAD = 1.5


def unsteady(timed: dict[str, list[float]]) -> tuple[str, float] | None:
    """The path whose rounds differed most, and by how much (fastest / slowest), where that is
    more than STEADY_SPREAD; None where every path's rounds agree."""
    label, spread = max(
        ((label, max(speeds) / min(speeds)) for label, speeds in timed.items()),
        key=lambda item: item[1],
    )
    return (label, spread) if spread > STEADY_SPREAD else None


def agreement(
    reference: torch.Tensor, outputs: torch.Tensor, classifier: bool = True
) -> tuple[float, float]:
    """(max |outputs - reference| / max |reference|, a score of the same images' two outputs
    (B, K)): a classifier's share of top-1 classes equal; for embeddings (classifier=False:
    a headless model's, whose argmax means nothing) the least cosine similarity of an image's
    two embeddings, which is what a nearest-neighbour search (evaluate.py --knn) compares."""
    scale = reference.abs().max().clamp_min(1e-12)
    difference = float((outputs - reference).abs().max() / scale)
    if not classifier:
        return difference, float(torch.cosine_similarity(outputs, reference, dim=-1).min())
    return difference, float((outputs.argmax(-1) == reference.argmax(-1)).float().mean())
