"""An exported ONNX file run in onnxruntime where the commands run a `VisionTransformer`.

`OnnxModel` has what evaluate.py and `python -m vit.predict` use of a model for inference:
`num_classes`, `class_names`, `preprocess`, `model_name`, `precision`, `model(images)` ->
logits, and `.eval()` / `.to(device)`. The file describes itself in its metadata (written by
`vit.export`): `vit.class_names`, `vit.preprocess` (required: how its input is prepared), and
optionally `vit.model_name`, `vit.inference.precision` ("float32" or "int8") and `vit.output`
("logits" or "embeddings"; otherwise read from the graph's output name). What needs the PyTorch
model (attention maps, autocast, intermediate blocks) is refused by `refuse_flags` in one line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..models.registry import Preprocess
from .export_check import INSTALL_HINT

OUTPUT_KINDS = ("logits", "embeddings")


class OnnxModel:
    """An ONNX classifier (output logits (B, K)) or feature extractor (embeddings (B, D),
    num_classes 0) in an onnxruntime session on the CPU (or CUDA where its provider is
    installed), with `intra_op_num_threads` = torch's thread count at load time."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        ort = _onnxruntime()
        self.path = Path(path)
        self.threads = threads or torch.get_num_threads()
        self.device = torch.device("cpu")
        self._ort = ort
        self.session = self._session(["CPUExecutionProvider"])
        metadata = self.session.get_modelmeta().custom_metadata_map
        if "vit.preprocess" not in metadata:
            raise ValueError(
                "an ONNX file without our metadata (vit.preprocess: how its input is prepared); "
                "export it with python -m vit.export SRC --onnx FILE"
            )
        self.preprocess = Preprocess.from_dict(json.loads(metadata["vit.preprocess"]))
        self.model_name: str | None = _json(metadata, "vit.model_name")
        self.precision: str = _json(metadata, "vit.precision") or "float32"
        output = self.session.get_outputs()[0]
        self.input_name = self.session.get_inputs()[0].name
        self.output_kind = _json(metadata, "vit.output") or output.name
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(
                f"an ONNX file whose output is {self.output_kind!r}; ours give "
                f"{' or '.join(OUTPUT_KINDS)}: export it with python -m vit.export SRC --onnx FILE"
            )
        names = _json(metadata, "vit.class_names") or []
        if self.output_kind == "embeddings":
            self.num_classes, self.class_names = 0, None
        else:
            width = output.shape[-1]
            self.num_classes = width if isinstance(width, int) else len(names)
            self.class_names = names if len(names) == self.num_classes else None

    def _session(self, providers: list[str]):
        options = self._ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        try:
            return self._ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as e:  # onnxruntime's own errors (a protobuf it cannot parse, ...)
            raise ValueError(f"onnxruntime cannot run it: {e}") from None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W), normalised as `preprocess` says -> logits (B, K) or embeddings
        (B, D), float32 on `device`."""
        pixels = images.detach().to("cpu", torch.float32).contiguous().numpy()
        (out,) = self.session.run(None, {self.input_name: pixels})
        return torch.from_numpy(out).to(self.device)

    def eval(self) -> OnnxModel:
        return self

    def to(self, device: torch.device | str) -> OnnxModel:
        """The CPU; a CUDA device only where onnxruntime's CUDA provider is installed."""
        device = torch.device(device)
        if device.type == self.device.type:
            return self
        if device.type != "cuda" or "CUDAExecutionProvider" not in (
            self._ort.get_available_providers()
        ):
            raise ValueError(
                f"--device {device}: this onnxruntime runs ONNX files on the CPU only; pass "
                f"--device cpu (onnxruntime-gpu runs them on CUDA)"
            )
        self.session = self._session(["CUDAExecutionProvider", "CPUExecutionProvider"])
        self.device = device
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
        """The file's SHA-1 as a tensor: what identifies the weights in feature caches."""
        digest = hashlib.sha1(self.path.read_bytes()).digest()
        return {"onnx.sha1": torch.frombuffer(bytearray(digest), dtype=torch.uint8)}

    def parameters(self):
        """One empty tensor on the model's device: `next(model.parameters()).device` works."""
        return iter([torch.empty(0, device=self.device)])


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ValueError(f"running an ONNX file needs onnxruntime: {INSTALL_HINT}") from None
    return onnxruntime


def _json(metadata: dict[str, str], key: str):
    return json.loads(metadata[key]) if key in metadata else None


def is_onnx(source: object) -> bool:
    """Whether a model argument names an ONNX file."""
    return source is not None and Path(str(source)).suffix.lower() == ".onnx"


def onnx_device(args) -> str:
    """--device for a command: "auto" means the CPU for an ONNX file (onnxruntime's own)."""
    return "cpu" if args.device == "auto" and is_onnx(args.checkpoint) else args.device


def refuse_flags(model: object, flags: dict[str, bool], embedding: str = "pooled") -> None:
    """ValueError (one line) for the first flag given (`flags`: flag -> given) that an ONNX
    model cannot do: they need the PyTorch model. The features of an embeddings file (its
    output, the pooled embedding) are extracted as the PyTorch model's (`embedding` pooled or
    output); a classifier's file holds no features."""
    if not isinstance(model, OnnxModel):
        return
    for flag, given in flags.items():
        if not given:
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
    "--model-dtype": "casts the PyTorch model's weights",
}
