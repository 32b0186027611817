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


def random_images(*shapes):
    """Random RGB PIL images, one of each (H, W)."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (*s, 3), dtype=np.uint8)) for s in shapes]


def assert_matches_timm(config: dict, images) -> None:
    """Our transform of timm's data config `config` gives timm's pixels, exactly."""
    theirs, ours = timm_create_transform(**config), vit.create_transform(config)
    for image in images:
        torch.testing.assert_close(ours(image), theirs(image), rtol=0, atol=0)


@pytest.mark.parametrize("crop_pct", [0.875, 1.0])
@pytest.mark.parametrize("input_size", [(48, 64), (64, 48)])
def test_non_square_center_keeps_the_aspect_ratio_as_timm(input_size, crop_pct):
    """timm's "center" resizes a non-square input keeping the image's ratio (ResizeKeepRatio
    to the scale size, then the centre crop); it was squashed to the scale size here."""
    config = dict(
        input_size=(3, *input_size), interpolation="bicubic", crop_pct=crop_pct,
        crop_mode="center", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
    )  # fmt: skip
    assert_matches_timm(config, random_images((90, 70), (50, 200), (61, 83), (48, 64)))
    # timm's choice between the shorter-side resize and ResizeKeepRatio is on the scale size,
    # not on the input size: here (21, 20) / 2 floors to a square (10, 10)
    assert_matches_timm(dict(config, input_size=(3, 21, 20), crop_pct=2.0), random_images((31, 17)))


def test_squash_from_timms_config_of_a_vit():
    """24 of timm's vit_* weights evaluate with crop_mode "squash": both sides resized to the
    scale size. It was dropped from the dict and the image centre-cropped instead."""
    with torch.device("meta"):
        model = timm.create_model("vit_base_patch16_clip_384.openai_ft_in1k", pretrained=False)
    config = resolve_data_config({}, model=model)
    assert config["crop_mode"] == "squash"
    assert_matches_timm(config, random_images((300, 200), (200, 420)))
    small = dict(config, input_size=(3, 40, 56), crop_pct=0.875)  # a crop after the squash
    assert_matches_timm(small, random_images((90, 70), (50, 200)))


@pytest.mark.parametrize("crop_pct", [0.875, 1.0])
def test_border_pads_with_the_mean_colour_as_timm(crop_pct):
    """timm's "border": the longer side fitted to the scale size keeping the ratio, then padded
    with the mean colour (rounded to 0..255) and centre-cropped."""
    config = dict(
        input_size=(3, 48, 64), interpolation="bilinear", crop_pct=crop_pct, crop_mode="border",
        mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711),
    )  # fmt: skip
    images = random_images((90, 70), (50, 200), (61, 83), (21, 30))
    assert_matches_timm(config, images)
    assert_matches_timm(dict(config, input_size=(3, 40, 40)), images)


def test_crop_mode_is_kept_and_checked(tmp_path):
    """crop_mode travels through timm's dicts and our saved metadata; "center" is left out of
    the saved dict, so files (and feature caches) from before the field read and key as they
    did; another mode is refused naming it."""
    center = vit.Preprocess(input_size=(32, 48), crop_pct=0.9)
    assert center.crop_mode == "center" and "crop_mode" not in center.to_dict()
    assert vit.Preprocess.from_dict(center.to_dict()) == center
    squash = vit.Preprocess(crop_mode="squash")
    assert squash.to_dict()["crop_mode"] == "squash"
    assert vit.Preprocess.from_dict(squash.to_dict()) == squash
    assert squash.data_config()["crop_mode"] == "squash"
    model = vit.create_model("vit_tiny_patch16_224", depth=1, num_classes=2)
    model.preprocess = squash
    vit.save_weights(model, tmp_path / "squash.safetensors")
    assert vit.load_model(tmp_path / "squash.safetensors").preprocess == squash
    with pytest.raises(ValueError, match="crop_mode 'crop' .*'center', 'squash', 'border'"):
        vit.Preprocess(crop_mode="crop")


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
    assert spec.preprocess.crop_mode == cfg.crop_mode
    assert spec.num_classes == cfg.num_classes


def test_families_offer_timms_sizes():
    for family, pattern in (
        ("dinov2", "vit_*_patch14_*dinov2"),
        ("siglip", "vit_*_siglip_*"),
        ("deit3", "deit3_*"),
        ("deit", "deit_*"),
    ):
        ours = {n for n, spec in MODELS.items() if spec.family == family}
        theirs = set(timm.list_models(pattern, pretrained=True))
        theirs = {n.split(".")[0] for n in theirs}
        # timm's sizes, except weights only at sizes/names not listed here
        assert ours <= theirs and len(ours) >= 4, family
