"""RandAugment on whole batches (vit.data.batch_randaugment): each op, image by image, equals
torchvision's functional op at the magnitude the image drew; a mixed batch equals its images
taken one at a time; the draws come from the generator in the documented order; the in-memory
pipeline and train.py use it under --batch-augment --aa randaug, and resume exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode

from vit.data.batch_pipeline import InMemoryBatches, random_crop
from vit.data.batch_randaugment import OPS, RANGES, apply_ops, rand_augment

B, H, W = 6, 16, 20  # not square: height and width must not be swapped


@pytest.fixture
def images() -> torch.Tensor:
    """uint8 (B, 3, H, W): noise over a gradient, so that every op has something to change."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 120, (B, 3, H, W), generator=generator)
    ramp = torch.linspace(0, 135, W).round().long()
    return (noise + ramp).clamp(0, 255).to(torch.uint8)


def reference(name: str, image: torch.Tensor, m: float) -> torch.Tensor:
    """torchvision's op on one uint8 (3, H, W) image at magnitude m, as float 0..255."""
    unit = image.float() / 255  # torchvision's float images span 0..1
    affine = dict(angle=0.0, translate=[0.0, 0.0], scale=1.0, shear=[0.0, 0.0])
    geometric = {
        "rotate": {"angle": m},
        "shear_x": {"shear": [m, 0.0]},
        "shear_y": {"shear": [0.0, m]},
        "translate_x": {"translate": [m * W, 0.0]},
        "translate_y": {"translate": [0.0, m * H]},
    }
    if name in geometric:
        settings = {**affine, **geometric[name]}
        return TF.affine(image.float(), interpolation=InterpolationMode.BILINEAR, **settings)
    if name == "posterize":
        return TF.posterize(image, math.floor(m)).float()
    if name == "equalize":
        return TF.equalize(image).float()
    ops = {
        "brightness": TF.adjust_brightness,
        "contrast": TF.adjust_contrast,
        "saturation": TF.adjust_saturation,
        "sharpness": TF.adjust_sharpness,
        "solarize": TF.solarize,
        "autocontrast": lambda x, _: TF.autocontrast(x),
    }
    return ops[name](unit, m) * 255


@pytest.mark.parametrize("name", OPS)
def test_each_op_is_torchvisions_image_by_image(name, images):
    u = torch.rand(B, generator=torch.Generator().manual_seed(1))
    op = torch.full((B,), OPS.index(name))
    out = apply_ops(images.float(), op, u)
    torch.testing.assert_close(apply_ops(images.float(), op, u, whole_batch=True), out)
    low, high = RANGES.get(name, (0.0, 0.0))
    changed = 0
    for i in range(B):
        expected = reference(name, images[i], low + u[i].item() * (high - low))
        torch.testing.assert_close(out[i], expected, rtol=0, atol=0.02, msg=f"{name}, image {i}")
        changed += not torch.equal(out[i], images[i].float())
    assert changed == B  # no op at these magnitudes leaves an image as it was


def test_a_mixed_batch_is_its_images_one_at_a_time(images):
    """Per-image statistics (contrast's mean, equalize's histogram, autocontrast's range) are
    each image's own, and an image keeps only the op it drew, on the CPU's way and the GPU's."""
    x = images.float().repeat(3, 1, 1, 1)[: len(OPS)]  # one image per op
    op = torch.arange(len(OPS))
    u = torch.rand(len(OPS), generator=torch.Generator().manual_seed(2))
    batch = apply_ops(x, op, u)
    for i in range(len(OPS)):
        alone = apply_ops(x[i : i + 1], op[i : i + 1], u[i : i + 1])
        torch.testing.assert_close(batch[i : i + 1], alone, rtol=0, atol=1e-3, msg=OPS[i])
    # the GPU's way (every op on the whole batch, each image keeping its own) gives the same
    torch.testing.assert_close(apply_ops(x, op, u, whole_batch=True), batch, rtol=0, atol=1e-3)


def test_draws_come_from_the_generator_in_order_and_repeat(images):
    """Per round: every image's op, then every image's magnitude."""
    x = images.float()
    out = rand_augment(x, 2, torch.Generator().manual_seed(3))
    replay = torch.Generator().manual_seed(3)
    expected = x
    for _ in range(2):
        op = torch.randint(len(OPS), (B,), generator=replay)
        expected = apply_ops(expected, op, torch.rand(B, generator=replay))
    assert torch.equal(out, expected)
    assert torch.equal(rand_augment(x, 2, torch.Generator().manual_seed(3)), out)
    assert torch.equal(rand_augment(x, 0, torch.Generator().manual_seed(3)), x)
    assert out.min() >= 0 and out.max() <= 255


def test_ops_are_drawn_uniformly():
    """Each of the 13 ops takes about 1/13 of 13,000 draws (within 5 standard deviations)."""
    x = torch.zeros(13_000, 3, 1, 1)
    generator = torch.Generator().manual_seed(4)
    op = torch.randint(len(OPS), (len(x),), generator=generator)
    counts = torch.bincount(op, minlength=len(OPS)).float()
    spread = math.sqrt(len(x) * (1 / 13) * (12 / 13))
    assert ((counts - 1000).abs() < 5 * spread).all()


def test_the_in_memory_pipeline_applies_it_after_crop_and_flip():
    """randaug_ops=2: the crop and flip draws first, as without it, then RandAugment's, then
    the normalisation (0 leaves the stream as it was: the CPU recipes repeat, see
    test_cpu_batches_draw_the_stream_every_earlier_release_drew). Replayed by hand."""
    data = np.random.default_rng(0).integers(0, 256, size=(8, 8, 8, 3), dtype=np.uint8)
    settings = dict(batch_size=4, mean=(0.5,) * 3, std=(0.25,) * 3, pad=2, seed=1)
    batches = InMemoryBatches(data, np.arange(8), randaug_ops=2, **settings)
    batch = torch.from_numpy(data[:4]).permute(0, 3, 1, 2)
    ours = batches.augment(batch, torch.Generator().manual_seed(5), torch.arange(4))
    generator = torch.Generator().manual_seed(5)
    x = random_crop(batch.float(), 2, generator)
    flip = torch.rand(4, generator=generator) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    x = rand_augment(x, 2, generator)
    torch.testing.assert_close(ours, (x - 0.5 * 255) / (0.25 * 255))


def test_train_py_trains_with_it_and_resumes_exactly(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    from conftest import assert_resumes_exactly
    from safetensors.torch import load_file

    flags = ("--batch-augment", "--aa", "randaug", "--aa-n", "2")
    reference = assert_resumes_exactly(train_script, monkeypatch, tmp_path, image_folder, *flags)
    theirs = load_file(reference / "model.safetensors")
    plain = tmp_path / "plain"
    assert train_script.main(tiny_args(image_folder, plain, 2, "--batch-augment")) == 0
    other = load_file(plain / "model.safetensors")
    assert not all(torch.equal(other[k], theirs[k]) for k in theirs)
