"""Exporting a model as a transformers folder, checked by transformers' own `from_pretrained`."""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..models import families
from ..models.class_names import class_names_for
from ..models.vision_transformer import VisionTransformer
from ..utils.files import atomic_write_dir
from .export_check import (
    ExportCheck,
    check,
    cpu_float32,
    relative_difference,
    require,
    sample_images,
)
from .layouts import hf_common, huggingface

# What export_transformers writes: a folder holding anything else is not an export to replace.
FOLDER_FILES = ("config.json", "model.safetensors", "preprocessor_config.json")


def export_transformers(
    model: VisionTransformer, folder: str | Path, tolerance: float = 1e-5
) -> ExportCheck:
    """Write a transformers folder (config.json with id2label, model.safetensors,
    preprocessor_config.json) of the class the model's family is written as (`vit.models.families`:
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
    if output == "logits":  # the tokens too: an untrained (zero) head's logits prove nothing
        with torch.no_grad():
            tokens = getattr(theirs, theirs.base_model_prefix)(**inputs).last_hidden_state
            difference = max(
                difference, relative_difference(tokens, model.forward_features(images))
            )
        check(difference, tolerance, target, "final tokens")
        return ExportCheck(folder, target, difference, "logits and final tokens")
    return ExportCheck(folder, target, difference, COMPARED[output])
