"""Levers for fast training: patch dropout, dynamic image size, in-memory batch augmentation."""

import functools

import numpy as np
import pytest
import timm
import torch

import vit
from vit.data.batch_pipeline import InMemoryBatches, random_crop, random_erase
from vit.data.batch_randaugment import apply_ops
from vit.data.transforms import AugmentConfig, train_transform
from vit.models.registry import Preprocess

TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 5}


def test_dynamic_img_size_matches_timm_at_other_sizes():
    torch.manual_seed(0)
    theirs = timm.create_model(
        "vit_tiny_patch16_224", dynamic_img_size=True, num_classes=10, depth=2
    ).eval()
    torch.nn.init.normal_(theirs.head.weight)  # a zero head would compare zeros
    ours = vit.create_model(
        "vit_tiny_patch16_224", dynamic_img_size=True, num_classes=10, depth=2
    ).eval()
    ours.load_state_dict(theirs.state_dict())
    for size in [(160, 96), (224, 224), (64, 64)]:
        images = torch.randn(2, 3, *size)
        reference = theirs(images)
        assert reference.abs().max() > 0
        assert torch.equal(ours(images), reference), size


def test_fixed_size_model_refuses_other_sizes_and_names_the_fix():
    model = vit.create_model("vit_cifar_patch4_32", **TINY)
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        model(torch.randn(1, 3, 16, 16))


def test_training_at_a_smaller_size_trains_the_full_size_position_embeddings():
    model = vit.create_model("vit_cifar_patch4_32", dynamic_img_size=True, **TINY).train()
    model.head.weight.data.normal_()
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    assert model.pos_embed.grad.shape == (1, 1 + 8 * 8, 32)
    assert model.pos_embed.grad[:, 1:].abs().sum() > 0


def test_patch_dropout_keeps_prefix_and_a_random_share_of_patches_in_training_only():
    torch.manual_seed(0)
    model = vit.create_model("vit_cifar_patch4_32", patch_drop_rate=0.75, **TINY)
    reference = vit.create_model("vit_cifar_patch4_32", **TINY)
    reference.load_state_dict(model.state_dict())
    model.train()
    tokens = torch.arange(2 * 65, dtype=torch.float32).view(2, 65, 1).expand(-1, -1, 32)
    kept = model.patch_drop(tokens)  # (B, 1 + 16, D): 64 * 0.25 patches survive
    assert kept.shape == (2, 17, 32)
    assert torch.equal(kept[:, 0], tokens[:, 0])  # the class token is always kept
    positions = kept[:, 1:, 0] - torch.tensor([[0.0], [65.0]])  # token index within its image
    for row in positions.long().tolist():
        assert len(set(row)) == 16 and set(row) <= set(range(1, 65))  # distinct patch tokens
    assert positions[0].tolist() != positions[1].tolist()  # drawn per image
    model.eval(), reference.eval()
    images = torch.randn(3, 3, 32, 32)
    model.head.weight.data.normal_(), reference.head.weight.data.copy_(model.head.weight.data)
    assert torch.equal(model(images), reference(images))  # evaluation sees every token


def test_patch_drop_rate_out_of_range_is_named():
    with pytest.raises(ValueError, match="patch_drop_rate"):
        vit.create_model("vit_cifar_patch4_32", patch_drop_rate=1.0, **TINY)


def _batches(images, **overrides):
    settings = {
        "batch_size": 4,
        "mean": (0.5, 0.4, 0.3),
        "std": (0.2, 0.25, 0.3),
        "seed": 1,
        **overrides,
    }
    return InMemoryBatches(images, np.arange(len(images)), **settings)


@pytest.fixture
def images():
    return np.random.default_rng(0).integers(0, 256, size=(12, 8, 8, 3), dtype=np.uint8)


def test_unaugmented_batches_are_the_normalised_images_in_a_seeded_order(images):
    loader = _batches(images, pad=0, hflip=0.0)
    loader.set_epoch(0)
    seen = []
    for batch, labels in loader:
        expected = torch.from_numpy(images[labels.numpy()]).permute(0, 3, 1, 2).float() / 255
        mean, std = torch.tensor([0.5, 0.4, 0.3]), torch.tensor([0.2, 0.25, 0.3])
        expected = (expected - mean[:, None, None]) / std[:, None, None]
        torch.testing.assert_close(batch, expected)
        seen += labels.tolist()
    assert sorted(seen) == list(range(12)) and seen != list(range(12))


def test_epochs_are_reproducible_and_differ_and_ranks_split_the_data(images):
    def epoch(loader, number):
        loader.set_epoch(number)
        return [(b.clone(), y.clone()) for b, y in loader]

    first, again = epoch(_batches(images), 3), epoch(_batches(images), 3)
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(first, again, strict=True)
    )
    other = epoch(_batches(images), 4)
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(first, other, strict=True))
    shares = [
        torch.cat([y for _, y in epoch(_batches(images, rank=r, world_size=2, batch_size=3), 0)])
        for r in range(2)
    ]
    assert len(shares[0]) == len(shares[1]) == 6
    assert sorted(torch.cat(shares).tolist()) == list(range(12))


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_random_crop_shifts_each_image_inside_its_padding(mode):
    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).view(2, 1, 5, 5) + 1
    out = random_crop(x, pad=2, generator=torch.Generator().manual_seed(0), mode=mode)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), mode=mode)
    for i in range(2):
        windows = [padded[i, :, dy : dy + 5, dx : dx + 5] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    if mode == "reflect":  # nothing black comes in from the edges: every pixel is the image's
        assert set(out.unique().tolist()) <= set(x.unique().tolist())
    # and over many images every one of the (2 pad + 1)^2 offsets occurs, the last ones too
    many = x[:1].expand(300, 1, 5, 5)
    out = random_crop(many, pad=2, generator=torch.Generator().manual_seed(1), mode=mode)
    windows = {
        (dy, dx): padded[0, :, dy : dy + 5, dx : dx + 5] for dy in range(5) for dx in range(5)
    }
    seen = {next(at for at, w in windows.items() if torch.equal(image, w)) for image in out}
    assert seen == set(windows)


@pytest.mark.parametrize("height,width", [(8, 32), (32, 8)])
def test_random_erasing_boxes_take_each_side_from_that_side_of_non_square_images(height, width):
    """A box is 10-40% of the image's height tall and 10-40% of its width wide: on a 8x32
    image at most 3 rows and 12 columns, boxes on average 4-5 times as wide as tall."""
    x = torch.zeros(64, 3, height, width)
    out = random_erase(x, 1.0, torch.Generator().manual_seed(0))
    erased = out != 0  # the noise replaces the zeros
    assert torch.equal(erased, erased[:, :1].expand_as(erased))  # every channel alike
    rows = erased[:, 0].any(dim=2).sum(dim=1).float()  # (B,) rows the box covers
    cols = erased[:, 0].any(dim=1).sum(dim=1).float()
    assert torch.equal(erased[:, 0].sum(dim=(1, 2)).float(), rows * cols)  # one rectangle
    assert rows.min() >= 1 and rows.max() <= int(0.4 * height)
    assert cols.min() >= 1 and cols.max() <= int(0.4 * width)
    long, short = (cols, rows) if width > height else (rows, cols)
    assert 3.5 < long.mean() / short.mean() < 5.5  # measured 4.5 and 5.0 (sides floored)


def test_the_per_image_crop_pads_as_the_batch_pipeline_does():
    # --crop-pad-mode reflect is torch's reflect in both pipelines: the edge pixel not repeated
    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    preprocess = Preprocess(input_size=(8, 8), mean=(0.0,) * 3, std=(1 / 255,) * 3)
    for mode in ("constant", "reflect"):
        aug = AugmentConfig(crop="pad", crop_pad=3, crop_pad_mode=mode, aa="none", reprob=0)
        pad_op = train_transform(preprocess, aug).transforms[1]  # Resize, PadIfNeeded, RandomCrop
        padded = pad_op(image=image)["image"]  # (14, 14, 3)
        expected = torch.nn.functional.pad(
            torch.from_numpy(image).permute(2, 0, 1).float()[None], (3, 3, 3, 3), mode=mode
        )[0].permute(1, 2, 0)
        assert np.array_equal(padded, expected.numpy().astype(np.uint8))
    with pytest.raises(ValueError, match="--crop-pad 8 with --crop-pad-mode reflect"):
        train_transform(preprocess, AugmentConfig(crop="pad", crop_pad=8, crop_pad_mode="reflect"))


def replayed_draws(images, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """What the pipeline of `_batches(pad=2, hflip=0.5, reprob=0.5)` makes of images[index] in
    one call, its draws replayed by hand in its order (crop offsets, flips, erasing's choice, box
    sides, places, noise), one image at a time: (len(index), 3, 8, 8)."""
    n = len(index)
    mean = torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1) * 255
    std = torch.tensor([0.2, 0.25, 0.3]).view(3, 1, 1) * 255
    dy, dx = (torch.randint(0, 5, (n,), generator=generator) for _ in range(2))
    flip = torch.rand(n, generator=generator) < 0.5
    erase = torch.rand(n, generator=generator) < 0.5
    sides = [
        (torch.empty(n).uniform_(0.1, 0.4, generator=generator) * 8).long().clamp(min=1)
        for _ in range(2)
    ]
    top = (torch.rand(n, generator=generator) * (8 - sides[0] + 1)).long()
    left = (torch.rand(n, generator=generator) * (8 - sides[1] + 1)).long()
    noise = torch.randn((n, 3, 8, 8), generator=generator)
    out = []
    for i, source in enumerate(index.tolist()):
        image = torch.from_numpy(images[source]).permute(2, 0, 1).float()
        image = torch.nn.functional.pad(image, (2, 2, 2, 2))
        image = image[:, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8]
        image = ((image.flip(-1) if flip[i] else image) - mean) / std
        if erase[i]:
            rows = slice(top[i], top[i] + sides[0][i])
            cols = slice(left[i], left[i] + sides[1][i])
            image[:, rows, cols] = noise[i][:, rows, cols]
        out.append(image)
    return torch.stack(out)


def test_cpu_batches_draw_the_stream_every_earlier_release_drew(images):
    """On the CPU the in-memory pipeline draws from its generator in the order it always has
    (the permutation, then per batch the draws `replayed_draws` replays), so the CPU recipes'
    measured runs repeat exactly."""
    loader = _batches(images, pad=2, hflip=0.5, reprob=0.5)
    loader.set_epoch(3)
    generator = torch.Generator().manual_seed(1 * 1_000_003 + 3)
    order = torch.randperm(12, generator=generator)
    for number, (batch, labels) in enumerate(loader):
        index = order[number * 4 : number * 4 + 4]
        assert labels.tolist() == index.tolist()
        expected = replayed_draws(images, index, generator)
        torch.testing.assert_close(batch, expected, rtol=0, atol=0)


def test_batches_augmented_two_at_a_time_draw_once_a_call_the_last_filled_up(images):
    """--augment-batches 2 over 3 batches of 4: the first call draws for 8 images and gives
    batches 1 and 2; the second draws for the last 4 and, to keep one shape, the epoch's first
    4 again, and gives batch 3 only. An epoch is still every image once."""
    loader = _batches(images, pad=2, hflip=0.5, reprob=0.5, augment_batches=2)
    loader.set_epoch(3)
    batches = list(loader)
    generator = torch.Generator().manual_seed(1 * 1_000_003 + 3)
    order = torch.randperm(12, generator=generator)
    first = replayed_draws(images, order[:8], generator)
    second = replayed_draws(images, torch.cat([order[8:], order[:4]]), generator)
    expected = [(first[:4], order[:4]), (first[4:], order[4:8]), (second[:4], order[8:])]
    assert len(batches) == len(expected) == len(loader)
    for (batch, labels), (images_expected, labels_expected) in zip(batches, expected, strict=True):
        assert labels.tolist() == labels_expected.tolist()
        torch.testing.assert_close(batch, images_expected, rtol=0, atol=0)
    loader.set_epoch(3)  # an epoch again (as after a resume): the same batches
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, loader, strict=True))


def test_batches_augmented_n_at_a_time_cost_the_host_a_fraction_of_the_operations():
    """The host's share of the augmentation, counted as the operations dispatched (each a
    kernel launch on a GPU): RandAugment x2 on whole batches (a GPU's way) over 8 batches,
    augmented one at a time and 4 at a time."""
    from conftest import Dispatched

    data = np.random.default_rng(0).integers(0, 256, size=(64, 8, 8, 3), dtype=np.uint8)
    counts = {}
    for augment_batches in (1, 4):
        loader = _batches(
            data, batch_size=8, randaug_ops=2, hflip_alternate=True, reprob=0.25,
            augment_batches=augment_batches,
        )  # fmt: skip
        loader.apply_randaug = functools.partial(apply_ops, whole_batch=True)
        loader.set_epoch(1)
        with Dispatched() as dispatched:
            assert sum(len(labels) for _, labels in loader) == 64
        counts[augment_batches] = len(dispatched.names)
    # 2 calls instead of 8: a quarter of the operations, and the slicing into batches
    assert counts[4] < counts[1] / 3.5, counts


def test_train_py_augments_n_batches_at_a_time_and_resumes_exactly(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """--augment-batches 4 over an epoch of 6 batches (a full call, then a filled-up one): a
    killed run resumes to the uninterrupted run's weights, and the flag reaches the pipeline
    (other draws than one batch a call: other weights)."""
    from conftest import assert_resumes_exactly
    from safetensors.torch import load_file

    flags = ("--batch-augment", "--aa", "randaug", "--reprob", "0.25")
    reference = assert_resumes_exactly(
        train_script, monkeypatch, tmp_path, image_folder, *flags, "--augment-batches", "4"
    )
    one_a_call = tmp_path / "one-a-call"
    assert train_script.main(tiny_args(image_folder, one_a_call, 2, *flags)) == 0
    ours, theirs = (load_file(run / "model.safetensors") for run in (reference, one_a_call))
    assert not all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_progressive_size_resizes_the_batch(images):
    loader = _batches(images)
    loader.set_epoch(0, size=4)
    batch, _ = next(iter(loader))
    assert batch.shape == (4, 3, 4, 4)


def test_progressive_resizing_averages_detail_too_fine_for_the_smaller_size():
    """A one-pixel checkerboard shrunk from 32 to 12 pixels is its mean grey (antialiased),
    not a pattern of the checkerboard's samples (aliased)."""
    board = ((np.indices((32, 32)).sum(0) % 2) * 255).astype(np.uint8)  # (32, 32)
    boards = np.repeat(board[None, :, :, None], 3, axis=3).repeat(4, axis=0)  # (4, 32, 32, 3)
    loader = _batches(boards, mean=(0, 0, 0), std=(1, 1, 1), pad=0, hflip=0.0)
    loader.set_epoch(0, size=12)
    batch, _ = next(iter(loader))  # (4, 3, 12, 12), 0..1
    assert batch.shape == (4, 3, 12, 12)
    inner = batch[..., 1:-1, 1:-1]  # the border pixels' filters reach past the image
    assert (inner - 0.5).abs().max() < 0.1, (inner - 0.5).abs().max()


def test_batch_larger_than_the_data_is_explained(images):
    with pytest.raises(ValueError, match="batch size <= 6"):
        _batches(images, batch_size=8, world_size=2)
