"""RandAugment per image (vit.data.transforms): each op of the menu is the batch path's op
(vit.data.batch_randaugment, PIL's definitions) at the same magnitude, over the same range;
autocontrast stretches where equalize equalises; sharpness is PIL's; ops are drawn as
RandAugment draws them (with replacement, applied in the order drawn); a seed repeats."""

from __future__ import annotations

import copy
import random

import albumentations as A
import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from vit.data import transforms
from vit.data.batch_randaugment import OPS, RANGES, apply_ops
from vit.data.transforms import AugmentConfig, randaugment_ops, train_transform
from vit.models.registry import Preprocess

H, W = 16, 20  # not square: height and width must not be swapped
PRE = Preprocess(input_size=(32, 32), mean=(0.5,) * 3, std=(0.25,) * 3)

# Where the menu's op keeps its range: the attribute (and its key), and the sign that turns a
# batch-path magnitude into the menu's (albumentations rotates the other way for the same
# angle; the range is symmetric, so the distribution is the same).
RANGE_OF = {
    "rotate": ("rotate", None, -1),
    "shear_x": ("shear", "x", 1),
    "shear_y": ("shear", "y", 1),
    "translate_x": ("translate_percent", "x", 1),
    "translate_y": ("translate_percent", "y", 1),
    "brightness": ("brightness", None, 1),
    "contrast": ("contrast", None, 1),
    "saturation": ("saturation", None, 1),
    "sharpness": ("factor", None, 1),
    "posterize": ("num_bits", None, 1),
    "solarize": ("threshold_range", None, 1),
}


def image() -> np.ndarray:
    """uint8 (H, W, 3): noise over a gradient, so that every op has something to change (and
    equalize and autocontrast differ)."""
    noise = np.random.default_rng(0).integers(0, 120, (H, W, 3))
    ramp = np.linspace(0, 135, W).round()[None, :, None]
    return (noise + ramp).clip(0, 255).astype(np.uint8)


def batch_op(name: str, img: np.ndarray, u: float) -> np.ndarray:
    """The batch path's op `name` on one (H, W, 3) image at magnitude draw u, float (H, W, 3)."""
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    out = apply_ops(x, torch.tensor([OPS.index(name)]), torch.tensor([float(u)]))
    return out[0].permute(1, 2, 0).numpy()


def menu_range(op: A.BasicTransform, name: str) -> list[float]:
    attr, key, sign = RANGE_OF[name]
    low, high = getattr(op, attr)[key] if key else getattr(op, attr)
    return sorted((sign * low, sign * high))


def pinned(op: A.BasicTransform, name: str, m: float) -> A.BasicTransform:
    """The menu's op with its range narrowed to the batch path's magnitude m."""
    attr, key, sign = RANGE_OF[name]
    value = (sign * m, sign * m)
    op = copy.deepcopy(op)
    setattr(op, attr, {**getattr(op, attr), key: value} if key else value)
    return op


@pytest.mark.parametrize("name", OPS)
def test_each_menu_op_is_the_batch_paths_op_at_its_magnitude(name):
    img = image()
    op = randaugment_ops()[OPS.index(name)]  # the menus are in the same order
    cases = []  # (the menu's op at a magnitude, what the batch path makes of img at it)
    if name not in RANGE_OF:  # equalize, autocontrast: no magnitude
        cases.append((op, batch_op(name, img, 0.0)))
    else:
        low, high = RANGES[name]
        menu_low, menu_high = menu_range(op, name)
        if name == "posterize":  # whole bits, 4 to 6 both drawn; the batch path floors 4..7
            menu_high += 1
        assert (menu_low, menu_high) == pytest.approx((low, high))
        for u in (0.05, 0.95):  # near both ends of the range
            m = low + u * (high - low)
            if name == "posterize":
                m = int(m)
            u_batch = u
            if name.startswith("translate"):  # albumentations moves by whole pixels
                size = W if name == "translate_x" else H
                u_batch = (int(m * size) / size - low) / (high - low)
            cases.append((pinned(op, name, m), batch_op(name, img, u_batch)))
    for menu_op, expected in cases:
        out = menu_op(image=img)["image"]
        # about a level: the menu's ops end in uint8 (brightness and contrast truncate), and
        # its contrast's grey mean is OpenCV's, of rounded greys (1.007 levels off at most)
        np.testing.assert_allclose(out, expected, rtol=0, atol=1.5, err_msg=name)
        assert not np.array_equal(out, img)


def test_autocontrast_stretches_where_equalize_equalises():
    """albumentations' AutoContrast defaults to method="cdf", histogram equalisation: the menu
    had equalize twice and no autocontrast."""
    img = image()
    menu = randaugment_ops()
    stretched = menu[OPS.index("autocontrast")](image=img)["image"]
    equalised = menu[OPS.index("equalize")](image=img)["image"]
    assert np.abs(stretched.astype(int) - equalised).max() > 10  # they differ on this image
    pil = Image.fromarray(img)
    np.testing.assert_allclose(stretched, np.asarray(ImageOps.autocontrast(pil)), atol=1)
    np.testing.assert_array_equal(equalised, np.asarray(ImageOps.equalize(pil)))


def test_sharpness_is_pils_and_leaves_a_flat_image_as_it_is():
    """PIL's ImageEnhance.Sharpness to within a level on noise at factors in its range, and
    the batch path's op; a flat grey image unchanged (A.Sharpen took 128 down to 90)."""
    op = randaugment_ops()[OPS.index("sharpness")]
    low, high = RANGES["sharpness"]
    rng = np.random.default_rng(1)
    for u in rng.uniform(size=4):
        img = rng.integers(0, 256, (9, 12, 3), dtype=np.uint8)
        factor = low + u * (high - low)
        out = pinned(op, "sharpness", factor)(image=img)["image"]
        pil = ImageEnhance.Sharpness(Image.fromarray(img)).enhance(factor)
        np.testing.assert_allclose(out, np.asarray(pil), rtol=0, atol=1)
        np.testing.assert_allclose(out, batch_op("sharpness", img, u), rtol=0, atol=1)
        assert np.abs(out.astype(int) - img).mean() > 3  # it did sharpen
    flat = np.full((8, 8, 3), 128, dtype=np.uint8)
    for seed in range(4):
        op.set_random_seed(seed)
        np.testing.assert_array_equal(op(image=flat)["image"], flat)


class Record(A.ImageOnlyTransform):
    """A menu op that only writes its position in the menu into `log`."""

    def __init__(self, index: int, log: list[int], p: float = 1.0) -> None:
        super().__init__(p=p)
        self.index, self.log = index, log

    def apply(self, img: np.ndarray, **params) -> np.ndarray:
        self.log.append(self.index)
        return img


def test_ops_are_drawn_with_replacement_and_applied_in_the_order_drawn(monkeypatch):
    """RandAugment (timm's, torchvision's, the batch path's) draws each op uniformly from the
    whole menu: 2 draws of 13 ops repeat one 1/13 of the time and come in descending menu
    order 6/13 of it. A.SomeOf did neither (no replacement, menu order)."""
    log = []
    monkeypatch.setattr(transforms, "randaugment_ops", lambda: [Record(i, log) for i in range(13)])
    augment = train_transform(PRE, AugmentConfig(aa_n=2, hflip=0, reprob=0))
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    draws = []
    for seed in range(390):
        augment.set_random_state(np.random.default_rng(seed), random.Random(seed))
        log.clear()
        augment(image=img)
        draws.append(tuple(log))
    assert {len(d) for d in draws} == {2}
    repeated = sum(a == b for a, b in draws)  # 30 expected, standard deviation 5.3
    descending = sum(a > b for a, b in draws)  # 180 expected, standard deviation 9.8
    assert 10 < repeated < 50 and 140 < descending < 220, (repeated, descending)
    assert np.bincount(np.ravel(draws), minlength=13).min() > 30  # 60 each expected


def test_a_seed_gives_the_same_images():
    """What `ImageDataset` does per sample: the pipeline's generators set from one seed. Two
    pipelines given the same seed agree (the menu's ops draw from those generators only);
    other seeds give other images."""

    def run(seed: int) -> torch.Tensor:
        augment = train_transform(PRE, AugmentConfig(aa_n=3, reprob=0.5))
        augment.set_random_state(np.random.default_rng(seed), random.Random(seed))
        return augment(image=image())["image"]  # resized to 32x32 first

    first = [run(seed) for seed in range(6)]
    assert all(torch.equal(run(seed), out) for seed, out in enumerate(first))
    assert all(not torch.equal(first[0], out) for out in first[1:])
