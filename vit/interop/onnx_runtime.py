"""An exported ONNX file run where the commands run a `VisionTransformer`, by onnxruntime (the
default) or by OpenVINO (`--runtime openvino`, an optional package: `pip install
'vit-from-scratch[openvino]'`).

`OnnxModel` has what evaluate.py and `python -m vit.predict` use of a model for inference:
`num_classes`, `class_names`, `preprocess`, `model_name`, `precision`, `model(images)` ->
logits, and `.eval()` / `.to(device)`. The file describes itself in its metadata (written by
`vit.export`): `vit.class_names`, `vit.preprocess` (required: how its input is prepared), and
optionally `vit.model_name`, `vit.precision` ("float32" or "int8") and `vit.output`
("logits" or "embeddings"; otherwise read from the graph's output name). What needs the PyTorch
model (attention maps, autocast, intermediate blocks) is refused by `refuse_flags` in one line.
OpenVINO computes in float32 unless told bfloat16 (`.to(torch.bfloat16)`, which
`--model-dtype bfloat16` does): left alone it would pick bfloat16 itself on a CPU that has it,
and the same file would give other figures on another machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ..models.registry import Preprocess
from .export_check import INSTALL_HINT, OPENVINO_HINT

OUTPUT_KINDS = ("logits", "embeddings")
RUNTIMES = ("onnxruntime", "openvino")


class OnnxruntimeSession:
    """The file in an onnxruntime session: its metadata, its output, and a call on numpy."""

    def __init__(self, path: Path, threads: int, providers: tuple[str, ...] = ()) -> None:
        self._ort = _import("onnxruntime", INSTALL_HINT)
        options = self._ort.SessionOptions()
        options.intra_op_num_threads = threads
        try:
            self.session = self._ort.InferenceSession(
                str(path), options, providers=list(providers or ["CPUExecutionProvider"])
            )
        except Exception as e:  # onnxruntime's own errors (a protobuf it cannot parse, ...)
            raise ValueError(f"onnxruntime cannot run it: {e}") from None
        self.metadata = self.session.get_modelmeta().custom_metadata_map
        output = self.session.get_outputs()[0]
        self.output_name, self.output_width = output.name, output.shape[-1]
        self.input_name = self.session.get_inputs()[0].name

    def cuda_available(self) -> bool:
        return "CUDAExecutionProvider" in self._ort.get_available_providers()

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        (out,) = self.session.run(None, {self.input_name: pixels})
        return out


class OpenvinoSession:
    """The file compiled by OpenVINO for the CPU, computing in `precision` ("f32" or "bf16"),
    one request at a time (latency mode, as the other runtimes run)."""

    def __init__(self, path: Path, threads: int, precision: str = "f32") -> None:
        openvino = _import("openvino", OPENVINO_HINT)
        core = openvino.Core()
        try:
            graph = core.read_model(str(path))
            self.compiled = core.compile_model(
                graph,
                "CPU",
                {
                    "INFERENCE_NUM_THREADS": threads,
                    "INFERENCE_PRECISION_HINT": precision,
                    "PERFORMANCE_HINT": "LATENCY",
                },
            )
        except Exception as e:  # OpenVINO's own errors, several lines under source locations
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            said = [line for line in lines if not line.startswith("Exception from ")]
            first = (said or lines or [type(e).__name__])[0]
            raise ValueError(f"OpenVINO cannot run it: {first}") from None
        info = graph.get_rt_info()
        # the ONNX file's metadata_props, kept by OpenVINO's reader under "framework"
        framework = info["framework"] if "framework" in info else {}
        self.metadata = {key: value.astype(str) for key, value in framework.items()}
        output = graph.outputs[0]
        self.output_name = output.get_any_name()
        width = output.get_partial_shape()[-1]
        self.output_width = width.get_length() if width.is_static else None

    def cuda_available(self) -> bool:
        return False

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        return self.compiled(pixels)[0]


class OnnxModel:
    """An ONNX classifier (output logits (B, K)) or feature extractor (embeddings (B, D),
    num_classes 0) run by `runtime` (onnxruntime, on the CPU or CUDA where its provider is
    installed; or OpenVINO, on the CPU), with torch's thread count at load time."""

    def __init__(
        self, path: str | Path, threads: int | None = None, runtime: str = "onnxruntime"
    ) -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime {runtime!r}: accepted: {', '.join(RUNTIMES)}")
        self.path = Path(path)
        self.threads = threads or torch.get_num_threads()
        self.device = torch.device("cpu")
        self.runtime = runtime
        self.compute_dtype = torch.float32  # OpenVINO's inference precision (bfloat16 on asking)
        self.session = self._session()
        metadata = self.session.metadata
        if "vit.preprocess" not in metadata:
            raise ValueError(
                "an ONNX file without our metadata (vit.preprocess: how its input is prepared); "
                "export it with python -m vit.export SRC --onnx FILE"
            )
        self.preprocess = Preprocess.from_dict(json.loads(metadata["vit.preprocess"]))
        self.model_name: str | None = _json(metadata, "vit.model_name")
        self.precision: str = _json(metadata, "vit.precision") or "float32"
        self.output_kind = _json(metadata, "vit.output") or self.session.output_name
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(
                f"an ONNX file whose output is {self.output_kind!r}; ours give "
                f"{' or '.join(OUTPUT_KINDS)}: export it with python -m vit.export SRC --onnx FILE"
            )
        names = _json(metadata, "vit.class_names") or []
        if self.output_kind == "embeddings":
            self.num_classes, self.class_names = 0, None
        else:
            width = self.session.output_width
            self.num_classes = width if isinstance(width, int) else len(names)
            self.class_names = names if len(names) == self.num_classes else None

    def _session(self, providers: tuple[str, ...] = ()):
        if self.runtime == "openvino":
            precision = "bf16" if self.compute_dtype == torch.bfloat16 else "f32"
            return OpenvinoSession(self.path, self.threads, precision)
        return OnnxruntimeSession(self.path, self.threads, providers)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W), normalised as `preprocess` says -> logits (B, K) or embeddings
        (B, D), float32 on `device`."""
        pixels = images.detach().to("cpu", torch.float32).contiguous().numpy()
        out = self.session(pixels)
        return torch.from_numpy(np.asarray(out, dtype=np.float32)).to(self.device)

    def eval(self) -> OnnxModel:
        return self

    def to(self, target: torch.device | str | torch.dtype) -> OnnxModel:
        """A device: the CPU; CUDA only where onnxruntime's CUDA provider is installed. A dtype
        (what `--model-dtype` casts to): OpenVINO computes in it, bfloat16 or float32; an
        onnxruntime file computes in what it was exported with."""
        if isinstance(target, torch.dtype):
            return self._compute_in(target)
        device = torch.device(target)
        if device.type == self.device.type:
            return self
        if device.type != "cuda" or not self.session.cuda_available():
            raise ValueError(
                f"--device {device}: {RUNNERS[self.runtime]} runs ONNX files on the CPU only; "
                f"pass --device cpu (onnxruntime-gpu runs them on CUDA)"
            )
        self.session = self._session(("CUDAExecutionProvider", "CPUExecutionProvider"))
        self.device = device
        return self

    def _compute_in(self, dtype: torch.dtype) -> OnnxModel:
        if dtype == self.compute_dtype:
            return self
        if self.runtime != "openvino" or dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"--model-dtype {str(dtype).removeprefix('torch.')}: an ONNX file computes in "
                f"what it was exported with ({self.precision}); OpenVINO computes a float file in "
                f"bfloat16: --runtime openvino"
            )
        self.compute_dtype = dtype
        self.session = self._session()
        return self

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """An embeddings file's output (B, D): what it holds of the features is the pooled
        embedding, which `forward_head(..., pre_logits=True)` passes on (`vit.inference.embed`)."""
        if self.num_classes:
            raise ValueError(
                "an ONNX classifier gives its logits, not its features: pass the weights it was "
                "exported from"
            )
        return self(images)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not pre_logits:
            raise ValueError("an ONNX file's head runs inside it: call the model")
        return features

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The file's SHA-1, with the runtime and the dtype it computes in, as a tensor: what
        identifies the weights in feature caches (OpenVINO's outputs are not onnxruntime's)."""
        digest = hashlib.sha1(self.path.read_bytes())
        digest.update(f"{self.runtime} {self.compute_dtype}".encode())
        return {"onnx.sha1": torch.frombuffer(bytearray(digest.digest()), dtype=torch.uint8)}

    def parameters(self):
        """One empty tensor on the model's device: `next(model.parameters()).device` works."""
        return iter([torch.empty(0, device=self.device)])


RUNNERS = {"onnxruntime": "this onnxruntime", "openvino": "OpenVINO"}


def _import(module: str, hint: str):
    """The runtime's package, or a one-line ValueError saying how to install it."""
    try:
        return __import__(module)
    except ImportError:
        raise ValueError(f"running an ONNX file needs {module}: {hint}") from None


def _json(metadata: dict[str, str], key: str):
    return json.loads(metadata[key]) if key in metadata else None


def is_onnx(source: object) -> bool:
    """Whether a model argument names an ONNX file."""
    return source is not None and Path(str(source)).suffix.lower() == ".onnx"


def onnx_device(args) -> str:
    """--device for a command: "auto" means the CPU for an ONNX file (its runtime's own)."""
    return "cpu" if args.device == "auto" and is_onnx(args.checkpoint) else args.device


def refuse_flags(model: object, flags: dict[str, bool], embedding: str = "pooled") -> None:
    """ValueError (one line) for the first flag given (`flags`: flag -> given) that an ONNX
    model cannot do: they need the PyTorch model. The features of an embeddings file (its
    output, the pooled embedding) are extracted as the PyTorch model's (`embedding` pooled or
    output); a classifier's file holds no features."""
    if not isinstance(model, OnnxModel):
        return
    for flag, given in flags.items():
        if not given or (flag == "--model-dtype" and model.runtime == "openvino"):
            continue
        if flag in FEATURE_FLAGS and model.num_classes == 0:
            if embedding in ("pooled", "output"):
                continue
            raise ValueError(
                f"--embedding {embedding}: an ONNX file gives its output only (the pooled "
                f"embedding): use --embedding pooled, or the weights it was exported from"
            )
        reason = REFUSED.get(flag, "needs the PyTorch model")
        if flag in FEATURE_FLAGS:
            reason += " (an ONNX classifier gives its logits, not its features)"
        raise ValueError(
            f"{flag}: {reason}; an ONNX file gives only its output: pass the weights it was "
            f"exported from"
        )


FEATURE_FLAGS = ("--features", "--knn", "--linear-probe")
REFUSED = {
    "--explain": "needs the PyTorch model (attention maps are read inside it)",
    "--amp": "is PyTorch's bfloat16 autocast",
    "--model-dtype": "casts the PyTorch model's weights (--runtime openvino computes an ONNX "
    "file in bfloat16)",
}
