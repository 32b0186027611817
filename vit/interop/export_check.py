"""Checking an export before it is put in place: the written file is run by the library it is
meant for on the same random images as our model, and its outputs must agree with ours."""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from ..models.vision_transformer import VisionTransformer

# The extras by the distribution's name: from PyPI, and in a checkout installed with -e (pip
# finds the distribution installed and adds what the extra asks)
INSTALL_HINT = "pip install 'vit-from-scratch[interop]'"
OPENVINO_HINT = "pip install 'vit-from-scratch[openvino]'"


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
