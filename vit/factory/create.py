"""The two ways to build a model: `create_model` (a named architecture, fresh or with weights
from timm or any file `vit.load_weights` reads) and `load_model` (a file or folder that records
its own architecture)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..interop import layouts
from ..interop.layouts import hf_common, hf_dinov2
from ..interop.weights import (
    Checkpoint,
    head_classes,
    load_weights,
    read_checkpoint,
    read_metadata,
)
from ..models.feature_maps import FeatureMaps
from ..models.registry import Preprocess, get_spec, split_tag
from ..models.vision_transformer import VisionTransformer, ViTConfig, model_class, to_pair
from .timm_weights import timm_pretrained


def create_model(
    name: str,
    pretrained: bool | str | Path = False,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    features_only: bool = False,
    out_indices: int | Sequence[int] = 3,
    checkpoint_path: str | Path | None = None,
    **overrides,
) -> VisionTransformer | FeatureMaps:
    """Build a named ViT, e.g. `create_model("vit_base_patch16_224", pretrained=True)`.

    name: one of `vit.list_models()`, optionally with one of timm's pretrained tags
        ("vit_base_patch16_224.dino", see `vit.list_models(pretrained=True)`), which selects
        those weights' preprocessing and head size.
    pretrained: False for fresh initialisation; True for timm's pretrained weights for this
        name and tag (its default tag without one; downloaded through timm from the Hugging
        Face hub, or read from its cache offline); or a weights file path in any layout
        `vit.load_weights` reads (timm, transformers, torchvision, Google JAX).
    num_classes: replace the classifier (a pretrained head of another size is dropped).
        None: the name's, or with a weights file the size of the file's own head (0 if it has
        none), so that a fine-tuned file classifies as it was trained.
    img_size: another input size; pretrained position embeddings are resampled to it.
    features_only, out_indices: timm's: instead of the model, a
    `vit.models.feature_maps.FeatureMaps`
        whose forward gives the outputs of blocks `out_indices` (the last n if an int) as
        (B, D, gh, gw) maps, the blocks after them, the final norm and the head pruned.
    checkpoint_path: timm's name for a weights file: the same as pretrained=PATH.
    overrides: any other `ViTConfig` field, e.g. drop_path_rate=0.1, or dynamic_img_size=True
        (any input size that is a multiple of the patch size; the position embeddings are
        resampled per call the way the weights' source library does, `pos_embed_resample`).
    The model comes back in training mode, as timm's `create_model` (and any new nn.Module):
    call `.eval()` before inference, or use `vit.load_model`, which returns an eval model.
    The model's `preprocess` attribute says how to prepare images (see `create_transform`):
    the name's (timm's) preprocessing, or torchvision's for torchvision weights. With weights
    whose LayerNorm eps is known (transformers': 1e-12) the model is built with that eps, so
    its logits equal the original model's, unless `norm_eps` is overridden.
    """
    if checkpoint_path is not None:
        if pretrained:
            raise ValueError(
                f"pretrained={pretrained!r} and checkpoint_path={str(checkpoint_path)!r}: give "
                f"the weights once (checkpoint_path is timm's name for pretrained=PATH)"
            )
        pretrained = checkpoint_path
    spec = get_spec(name)
    unknown = set(overrides) - set(ViTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(
            f"unknown override(s) {sorted(unknown)} for {name}; "
            f"accepted: {sorted(ViTConfig.__dataclass_fields__)}"
        )
    kwargs = {**spec.arch, "num_classes": spec.num_classes, **overrides}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    preprocess = spec.preprocess
    if img_size is not None:
        kwargs["img_size"] = img_size
        preprocess = replace(preprocess, input_size=to_pair(img_size, "img_size"))
    checkpoint = None
    if pretrained is True:
        checkpoint = read_checkpoint(timm_pretrained(split_tag(name)[0], spec.pretrained_tag))
    elif pretrained:
        checkpoint = read_checkpoint(pretrained)
    if checkpoint is not None:
        kwargs |= settings_of(checkpoint, own_head=pretrained is not True and num_classes is None)
        kwargs |= overrides  # what the caller asked for wins over what the weights say
    model = model_class(kwargs)(**kwargs)
    layout = layouts.BY_NAME[checkpoint.layout] if checkpoint is not None else None
    if layout is not None and layout.preprocess is not None:  # the weights' own (torchvision's)
        patch = to_pair(model.config.patch_size, "patch_size")  # torchvision: vit_h_14 is SWAG
        preprocess = Preprocess.from_dict(layout.preprocess(preprocess.input_size, patch))
    model.preprocess = preprocess
    model.model_name = name
    if checkpoint is not None:
        model.load_report = load_weights(model, checkpoint)
        recorded = checkpoint.metadata.get("vit.class_names")  # our files record them
        if recorded and not model.load_report.fresh_head and len(recorded) == model.num_classes:
            model.class_names = list(recorded)  # the kept head's classes
    return FeatureMaps(model, out_indices) if features_only else model


def settings_of(checkpoint: Checkpoint, own_head: bool) -> dict:
    """The ViTConfig fields a weights file sets: its head's size (own_head: timm refuses a head
    of another size, and dropping it would classify at random), its LayerNorm eps (known for
    transformers' files: their logits need it) and how its source resamples pos_embed."""
    settings = {"pos_embed_resample": checkpoint.pos_embed}
    if own_head:
        settings["num_classes"] = head_classes(checkpoint.state_dict)
    if checkpoint.norm_eps is not None:
        settings["norm_eps"] = checkpoint.norm_eps
    return settings


def load_model(
    path: str | Path,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    dynamic_img_size: bool | None = None,
) -> VisionTransformer:
    """Rebuild a model from a file or folder that says what architecture it holds.

    path: a `.safetensors` file written by `vit.save_weights` (the architecture, class names
        and preprocessing come from its metadata), or a transformers folder (`config.json` +
        `model.safetensors` or `pytorch_model.bin`; `preprocessor_config.json` if present) of
        a ViT, ViT-MAE, DINOv2, CLIP, SigLIP or distilled DeiT model.
    num_classes: replace the classifier (the stored head is then dropped).
    img_size: build the model for this input size (position embeddings resampled the way the
        weights' source library does). A transformers folder defaults to the size its
        preprocessing produces, except DINOv2's (below).
    dynamic_img_size: accept any input size that is a multiple of the patch size, the
        position embeddings resampled per call the way the weights' source library does
        (timm's option). None: as stored (our files), or as transformers runs the folder's
        model: True for DINOv2 (+- registers) without `img_size`, as transformers resamples
        it in every forward, so the model keeps the stored 518-px grid (37x37) and equals
        transformers at any size; its preprocessing stays 224 px (DINOv2's transform when the
        folder has no preprocessor_config.json). False for the other transformers families,
        and for DINOv2 given `img_size`: a model of that size, which refuses other sizes.
    The result is ready for inference, as transformers' `from_pretrained`: in eval mode
    (dropout, stochastic depth and patch dropout off; `.train()` turns them back on for
    fine-tuning). It carries `model.class_names` (None when unknown), `model.model_name` and
    `model.preprocess`.
    """
    path = Path(path)
    if path.is_dir():
        return _load_transformers_folder(path, num_classes, img_size, dynamic_img_size).eval()
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file or folder; vit.load_model reads our .safetensors files and "
            f"transformers folders (config.json + weights)"
        )
    if path.suffix != ".safetensors":
        raise ValueError(
            f"{path} does not say which architecture it holds (only our .safetensors files and "
            f"transformers folders do); load it with vit.create_model(NAME, pretrained="
            f"{str(path)!r}) instead"
        )
    metadata = read_metadata(path)
    if "vit.config" not in metadata:
        raise ValueError(
            f"{path} does not say which architecture it holds (no 'vit.config' metadata); "
            f"load it with vit.create_model(NAME, pretrained={str(path)!r}) instead"
        )
    config = dict(metadata["vit.config"])
    if num_classes is not None:
        config["num_classes"] = num_classes
    if img_size is not None:
        config["img_size"] = img_size
    if dynamic_img_size is not None:
        config["dynamic_img_size"] = dynamic_img_size
    model = model_class(config)(**config)
    load_weights(model, path)
    names = metadata.get("vit.class_names")
    model.class_names = names if names and len(names) == model.num_classes else None
    model.model_name = metadata.get("vit.model_name")
    stored = metadata.get("vit.preprocess")
    model.preprocess = (
        Preprocess.from_dict(stored)
        if stored
        else Preprocess(input_size=model.patch_embed.img_size)
    )
    if img_size is not None:  # the images prepared at the size the model now takes
        model.preprocess = replace(model.preprocess, input_size=to_pair(img_size, "img_size"))
    return model.eval()


def _load_transformers_folder(
    folder: Path,
    num_classes: int | None,
    img_size: int | tuple[int, int] | None,
    dynamic_img_size: bool | None,
) -> VisionTransformer:
    """A transformers folder -> our model, architecture and class names from config.json, at
    the input size of its preprocessing unless `img_size` says otherwise."""
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} is a folder without config.json: vit.load_model reads transformers "
            f"folders (config.json + model.safetensors or pytorch_model.bin) or our "
            f".safetensors files"
        )
    hf_config = hf_common.read_json(folder / "config.json")
    config, class_names = layouts.config_from_transformers(hf_config, source=str(folder))
    model_type = hf_config.get("model_type")
    dinov2 = model_type in hf_dinov2.MODEL_TYPES
    processor = folder / "preprocessor_config.json"
    settings = hf_common.read_json(processor) if processor.is_file() else {}
    # saved without preprocessor_config.json: the family's processor's defaults (DINOv2, CLIP,
    # SigLIP), not ViTImageProcessor's (preprocess_from_hf's own: ViT, DeiT, MAE)
    default = getattr(layouts.CONFIGS[model_type], "default_processor", None)
    settings = settings or (default(config["img_size"]) if default else {})
    preprocess = hf_common.preprocess_from_hf(settings, config["img_size"])
    checkpoint = read_checkpoint(folder)
    if model_type in ("vit", "deit"):  # the families with a classifier (id2label)
        # sized by its weight's rows, as transformers loads it: config.json's architectures may
        # be absent and id2label may have gaps (a count would build another head and drop it)
        config["num_classes"], class_names = hf_common.classifier_of(
            hf_config, checkpoint.state_dict, str(folder)
        )
    if num_classes is not None:
        config["num_classes"] = num_classes
    # An img_size asks for a model of that size: fixed, resampled once (resampling the
    # resampled grid again per call would be ~2% off transformers at other sizes).
    dynamic = dinov2 and not img_size if dynamic_img_size is None else dynamic_img_size
    config.update(dynamic_img_size=dynamic, pos_embed_resample=checkpoint.pos_embed)
    if img_size:
        config["img_size"] = preprocess["input_size"] = to_pair(img_size, "img_size")
    elif not dynamic:
        config["img_size"] = preprocess["input_size"]
    # else the stored grid is kept and resampled to each input, as the source library does
    model = model_class(config)(**config)
    load_weights(model, checkpoint)
    model.class_names = class_names if len(class_names or ()) == model.num_classes else None
    model.model_name = hf_config.get("_name_or_path") or folder.name
    model.preprocess = Preprocess.from_dict(preprocess)
    return model
