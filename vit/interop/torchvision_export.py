"""Exporting a model as a torchvision state dict, checked by `torchvision.models.vit_*`."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.vision_transformer import VisionTransformer
from ..utils.files import atomic_write
from .export_check import (
    ExportCheck,
    check,
    cpu_float32,
    our_outputs,
    relative_difference,
    sample_images,
)
from .layouts import torchvision as torchvision_layout


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
            # the features before the head too: a head never trained (ours start at zero)
            # gives logits of zero whatever the backbone, a comparison that proves nothing
            theirs.heads = torch.nn.Identity()
            features = model.forward_head(model.forward_features(images), pre_logits=True)
            difference = max(difference, relative_difference(theirs(images), features))
        check(difference, tolerance, target, "features before the head")
        described = f"{target}({_call_args(arch)})"
        result.append(ExportCheck(path, described, difference, "logits and features"))

    atomic_write(path, write)
    return result[0]


def _call_args(kwargs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())
