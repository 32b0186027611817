"""Named models: the same architectures, preprocessing and default weights as timm's."""

import re

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform as timm_create_transform
from timm.data import resolve_data_config
from timm.models import get_pretrained_cfg

import vit
from vit.models.registry import MODELS, get_spec

# timm's standard ViT names: sizes tiny..huge, patch 8/14/16/32, input 224/384.
STANDARD_PATTERN = r"vit_(tiny|small|base|large|huge)_patch(8|14|16|32)_(224|384)"
IMAGENET = [name for name in MODELS if not name.endswith("_32")]


def test_every_standard_timm_vit_name_is_offered():
    timm_names = {n for n in timm.list_models("vit_*") if re.fullmatch(STANDARD_PATTERN, n)}
    assert timm_names and timm_names <= set(vit.list_models())


@pytest.mark.parametrize("name", IMAGENET)
def test_architecture_matches_timm(name):
    with torch.device("meta"):  # shapes only: no memory, no init
        theirs = timm.create_model(name)
        ours = vit.create_model(name)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in theirs.state_dict().items()
    }
    assert ours.blocks[0].attn.num_heads == theirs.blocks[0].attn.num_heads


@pytest.mark.parametrize("name", IMAGENET)
def test_preprocessing_and_weights_tag_match_timms_default(name):
    spec = MODELS[name]
    cfg = get_pretrained_cfg(name)  # timm's default (first) tag for the name
    assert spec.pretrained_tag == (None if cfg.tag == "untrained" else cfg.tag)
    assert spec.preprocess.input_size == tuple(cfg.input_size[1:])
    assert spec.preprocess.mean == pytest.approx(cfg.mean)
    assert spec.preprocess.std == pytest.approx(cfg.std)
    assert spec.preprocess.interpolation == cfg.interpolation
    assert spec.preprocess.crop_pct == pytest.approx(cfg.crop_pct)
    assert spec.num_classes == cfg.num_classes


@pytest.mark.parametrize(
    "name,size",
    [
        ("vit_tiny_patch16_224", (300, 200)),  # crop_pct 0.9: resize to 248, centre crop 224
        ("vit_base_patch16_384", (500, 390)),  # crop_pct 1.0
        ("vit_small_patch8_224", (224, 320)),  # ImageNet mean/std
    ],
)
def test_eval_transform_matches_timms(name, size):
    model = vit.create_model(name) if name != "vit_base_patch16_384" else None
    preprocess = model.preprocess if model else MODELS[name].preprocess
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (*size, 3), dtype=np.uint8))
    ours = vit.create_transform(preprocess)(image)
    with torch.device("meta"):
        theirs_model = timm.create_model(name)
    theirs = timm_create_transform(**resolve_data_config({}, model=theirs_model))(image)
    assert ours.shape == (3, *preprocess.input_size)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_other_image_size_updates_preprocessing():
    model = vit.create_model("vit_tiny_patch16_224", img_size=(160, 192))
    assert model.preprocess.input_size == (160, 192)
    image = Image.new("RGB", (400, 300))
    assert vit.create_transform(model.preprocess)(image).shape == (3, 160, 192)


def test_cifar_models_are_32_pixel_patch_4():
    for name in ("vit_cifar_patch4_32", "vit_tiny_patch4_32", "vit_small_patch4_32"):
        model = vit.create_model(name)
        assert model.grid_size == (8, 8) and model.num_classes == 10
        assert model.preprocess.input_size == (32, 32)
    assert sum(p.numel() for p in vit.create_model("vit_cifar_patch4_32").parameters()) < 3e6


TAGGED = [name for name in vit.list_models(pretrained=True) if not name.endswith("_32")]


@pytest.mark.parametrize("tagged_name", TAGGED)
def test_every_offered_tag_has_timms_preprocessing_and_head(tagged_name):
    spec = get_spec(tagged_name)  # with the tag's preprocessing and head size
    cfg = get_pretrained_cfg(tagged_name)
    assert cfg is not None and tagged_name in timm.list_models(pretrained=True)
    assert spec.preprocess.input_size == tuple(cfg.input_size[1:])
    assert spec.preprocess.mean == pytest.approx(cfg.mean)
    assert spec.preprocess.std == pytest.approx(cfg.std)
    assert spec.preprocess.interpolation == cfg.interpolation
    assert spec.preprocess.crop_pct == pytest.approx(cfg.crop_pct)
    assert cfg.crop_mode == "center"  # the only crop our eval transform makes
    assert spec.num_classes == cfg.num_classes


def test_families_offer_timms_sizes():
    for family, pattern in (
        ("dinov2", "vit_*_patch14_*dinov2"),
        ("siglip", "vit_*_siglip_*"),
        ("deit3", "deit3_*"),
        ("deit", "deit_*"),
    ):
        ours = {n for n, spec in MODELS.items() if spec.family == family}
        theirs = set(timm.list_models(pattern, pretrained=True, exclude_filters=["*gap*"]))
        theirs = {n.split(".")[0] for n in theirs}
        # every size timm has, except what needs a layer this model lacks (SwiGLU: giant)
        # or weights only at sizes/names not listed here
        assert ours <= theirs and len(ours) >= 4, family
