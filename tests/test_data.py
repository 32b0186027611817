"""Datasets, augmentation pipelines and MixUp/CutMix on tiny real image files."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch
import torchvision
from conftest import OfflineCifar
from PIL import Image

import vit
from vit.data.datasets import (
    CorruptImageError,
    ImageDataset,
    files_digest,
    load_split,
    stratified_indices,
)
from vit.data.mixup import MixupCutmix, one_hot, soft_target_cross_entropy
from vit.data.transforms import AugmentConfig, EvalTransform, crop_padding, train_transform
from vit.models.registry import Preprocess

CLASSES = ("blue", "green", "red")  # as made by conftest.make_image_folder
CIFAR_PRE = vit.create_model("vit_cifar_patch4_32", depth=1).preprocess


def test_image_folder_splits(image_folder):
    train = load_split(str(image_folder), "train")
    test = load_split(str(image_folder), "test")
    assert train.class_names == test.class_names == sorted(CLASSES)
    assert len(train) == 48 and len(test) == 18
    assert np.bincount(train.labels).tolist() == [16, 16, 16]
    image, label = train[20]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and label == 1
    assert train.images is not None  # 32x32 images are cached decoded by default


def test_val_folder_is_accepted_as_test_split(tmp_path, make_images):
    make_images(tmp_path, train_per_class=2, test_per_class=3, test_name="val")
    assert len(load_split(str(tmp_path), "test")) == 9


def test_subset_is_stratified(image_folder):
    ds = load_split(str(image_folder), "train", subset=9, seed=1)
    assert np.bincount(ds.labels).tolist() == [3, 3, 3]
    labels = np.repeat(np.arange(4), 10)
    chosen = stratified_indices(labels, 10, seed=0)
    assert np.bincount(labels[chosen]).tolist() == [3, 3, 2, 2]
    # a class of one image: what it cannot give comes from the others (9 asked gave 7)
    small = np.array([0] + [1] * 100 + [2] * 100)
    for asked, per_class in [(9, [1, 4, 4]), (30, [1, 15, 14]), (500, [1, 100, 100])]:
        chosen = stratified_indices(small, asked, seed=0)
        assert np.bincount(small[chosen]).tolist() == per_class and len(set(chosen)) == len(chosen)


def test_unknown_data_names_the_input(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'imagenet42'.*cifar10, cifar100"):
        load_split("imagenet42", "train")
    (tmp_path / "test" / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no train/ subfolder"):
        load_split(str(tmp_path), "train")


def test_empty_class_folder_is_named(tmp_path, make_images):
    make_images(tmp_path, train_per_class=2, test_per_class=1)
    (tmp_path / "train" / "zebra").mkdir()
    with pytest.raises(ValueError, match=r"zebra holds no images"):
        load_split(str(tmp_path), "train")
    with pytest.raises(ValueError, match=r"no class folders"):
        (tmp_path / "empty" / "train").mkdir(parents=True)
        load_split(str(tmp_path / "empty"), "train")


@pytest.mark.parametrize("cache", [True, False])
def test_corrupt_image_is_reported_by_path(tmp_path, make_images, cache):
    make_images(tmp_path, train_per_class=3, test_per_class=1)
    bad = tmp_path / "train" / "green" / "0001.jpg"
    bad.write_bytes(b"\xff\xd8 definitely not a jpeg")
    if cache:
        with pytest.raises(CorruptImageError, match=str(bad)):
            load_split(str(tmp_path), "train", cache=True)
    else:
        ds = load_split(str(tmp_path), "train", cache=False)
        ds[0]  # a good image still loads
        with pytest.raises(CorruptImageError, match=str(bad)):
            ds[4]


def test_many_files_decode_in_processes_as_one_by_one(tmp_path, make_images, monkeypatch):
    """From MANY_FILES files on (here 4) `load_images` decodes in processes, never in threads:
    the arrays `load_image` gives, in order; a corrupt file raises the error naming it."""
    from vit.data import images

    def no_threads(*args, **kwargs):
        raise AssertionError("decoded in threads")

    monkeypatch.setattr(images, "MANY_FILES", 4)
    monkeypatch.setattr(images, "ThreadPoolExecutor", no_threads)
    make_images(tmp_path, train_per_class=5, test_per_class=1)
    paths = sorted(p for p in (tmp_path / "train").rglob("*") if p.is_file())
    decoded = images.load_images(paths, workers=2)
    assert len(decoded) == len(paths) >= 10
    for path, image in zip(paths, decoded, strict=True):
        assert np.array_equal(image, images.load_image(path))
    paths[7].write_bytes(b"\xff\xd8 definitely not a jpeg")
    with pytest.raises(CorruptImageError, match=str(paths[7])):
        images.load_images(paths, workers=2)


@pytest.mark.parametrize(
    ("size", "crop"), [((32, 32), "auto"), ((48, 40), "pad"), ((48, 40), "rrc")]
)
def test_train_transform_output(size, crop):
    image = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
    pre = Preprocess(input_size=(32, 32), mean=(0.5,) * 3, std=(0.25,) * 3)
    out = train_transform(pre, AugmentConfig(crop=crop, reprob=1.0))(image=image)["image"]
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert -2.0 - 1e-6 <= out.min() and out.max() <= 2.0 + 1e-6  # (x/255 - 0.5) / 0.25


def test_the_default_crop_padding_is_an_eighth_of_the_larger_side():
    assert crop_padding(None, (32, 48), "constant") == 6
    assert crop_padding(None, (48, 32), "constant") == 6
    assert crop_padding(3, (32, 48), "constant") == 3  # a padding given is kept


def test_per_image_random_erasing_boxes_are_10_to_40_percent_of_each_side():
    """--reprob 1 on a grey 40x40 image: every box 4 to 16 pixels tall and wide."""
    pre = Preprocess(input_size=(40, 40), mean=(0, 0, 0), std=(1, 1, 1))
    aug = AugmentConfig(crop="pad", crop_pad=0, hflip=0.0, aa="none", reprob=1.0)
    transform = train_transform(pre, aug)
    image = np.full((40, 40, 3), 128, dtype=np.uint8)
    heights, widths = [], []
    for seed in range(200):
        transform.set_random_seed(seed)
        out = transform(image=image)["image"]  # (3, 40, 40), 0..1
        erased = (out - 128 / 255).abs().amax(0) > 1e-3  # (40, 40)
        rows, cols = np.flatnonzero(erased.any(1).numpy()), np.flatnonzero(erased.any(0).numpy())
        heights.append(rows[-1] - rows[0] + 1)
        widths.append(cols[-1] - cols[0] + 1)
    assert 4 <= min(heights) and max(heights) <= 16, (min(heights), max(heights))
    assert 4 <= min(widths) and max(widths) <= 16, (min(widths), max(widths))


def test_random_resized_crop_can_take_the_whole_image():
    ops = train_transform(Preprocess(input_size=(48, 40)), AugmentConfig(crop="rrc")).transforms
    (crop,) = [op for op in ops if isinstance(op, A.RandomResizedCrop)]
    assert tuple(crop.scale) == (0.08, 1.0)


def test_augmentation_seeded_per_sample_and_epoch(image_folder):
    augment = train_transform(CIFAR_PRE, AugmentConfig())
    ds = load_split(str(image_folder), "train", transform=augment)
    first = ds[7][0]
    ds[3]  # drawing another sample must not change sample 7's augmentation
    assert torch.equal(first, ds[7][0])
    ds.set_epoch(1)
    assert not torch.equal(first, ds[7][0])
    ds.set_epoch(0)
    assert torch.equal(first, ds[7][0])
    other_seed = load_split(str(image_folder), "train", seed=1, transform=augment)
    assert not torch.equal(first, other_seed[7][0])


def test_derived_datasets_share_images_and_keep_their_own_labels(image_folder):
    raw = load_split(str(image_folder), "train", seed=3)
    shown = raw.with_transform(EvalTransform(CIFAR_PRE))
    assert shown.images is raw.images and shown.seed == 3 and raw.transform is None
    assert shown[0][0].shape == (3, 32, 32) and raw[0][0].shape == (32, 32, 3)
    # blue, green, red -> indices 2, 0, 1 of another class list
    moved = raw.relabel([2, 0, 1], ["green", "red", "blue"])
    assert moved.class_names == ["green", "red", "blue"] and moved.images is raw.images
    assert np.bincount(moved.labels).tolist() == [16, 16, 16]
    assert moved[0][1] == 2 and raw[0][1] == 0  # the original keeps its labels


@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
@pytest.mark.parametrize("input_size", [(32, 32), (24, 40)])
def test_eval_transform_matches_create_transform(input_size, crop_mode):
    image = np.random.default_rng(0).integers(0, 256, (50, 60, 3), dtype=np.uint8)
    pre = Preprocess(input_size=input_size, crop_pct=0.875, crop_mode=crop_mode)
    expected = vit.create_transform(pre)(Image.fromarray(image))
    assert torch.equal(EvalTransform(pre)(image), expected)


def test_one_hot_label_smoothing():
    targets = one_hot(torch.tensor([2, 0]), 4, smoothing=0.2)
    assert torch.allclose(targets.sum(1), torch.ones(2))
    assert targets[0].tolist() == pytest.approx([0.05, 0.05, 0.85, 0.05])


def test_mixup_mixes_images_and_labels_alike():
    torch.manual_seed(0)
    x, y = torch.rand(6, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    mixed, targets = MixupCutmix(5, mixup_alpha=0.4, cutmix_alpha=0.0)(x, y)
    assert torch.allclose(targets.sum(1), torch.ones(6))
    lam = targets[1, 1].item()  # sample 1 (class 1) is mixed with sample 4 (class 4)
    assert 0 < lam < 1 and targets[1, 4].item() == pytest.approx(1 - lam)
    assert torch.allclose(mixed, lam * x + (1 - lam) * x.flip(0), atol=1e-6)


def test_the_mixup_weight_is_drawn_from_a_symmetric_beta_alpha_alpha():
    """lam ~ Beta(alpha, alpha): mean 1/2 and variance 1 / (4 (2 alpha + 1)); Beta(0.8, 1)
    would give a mean of 0.444."""
    torch.manual_seed(0)
    mix = MixupCutmix(2, mixup_alpha=0.8, cutmix_alpha=0.0)
    x, y = torch.zeros(2, 1, 2, 2), torch.tensor([0, 1])
    lams = torch.tensor([mix(x, y)[1][0, 0].item() for _ in range(4000)])  # sample 0's own class
    assert abs(lams.mean().item() - 0.5) < 0.02
    assert abs(lams.var().item() - 1 / (4 * 2.6)) < 0.01


def test_cutmix_label_weights_equal_pasted_area():
    torch.manual_seed(3)
    x = torch.zeros(4, 1, 16, 16)
    x[1] = 1.0  # sample 2 receives its box from sample 1 (the batch mixes with itself reversed)
    y = torch.tensor([0, 1, 2, 3])
    for _ in range(5):
        mixed, targets = MixupCutmix(4, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.1)(
            x, y
        )
        pasted = mixed[2].mean().item()  # fraction of sample 2 now coming from sample 1
        assert torch.allclose(targets.sum(1), torch.ones(4))
        # smoothed targets: own class (1 - 0.1 + 0.025) * lam + 0.025 * (1 - lam)
        lam = 1 - pasted
        assert targets[2, 2].item() == pytest.approx(0.925 * lam + 0.025 * (1 - lam), abs=1e-6)
        assert targets[2, 1].item() == pytest.approx(0.025 * lam + 0.925 * (1 - lam), abs=1e-6)


def test_soft_target_cross_entropy_equals_hard_for_one_hot():
    logits, labels = torch.randn(5, 7), torch.tensor([0, 3, 6, 2, 2])
    soft = soft_target_cross_entropy(logits, one_hot(labels, 7))
    assert soft.item() == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item())


def test_copied_folder_fixture_is_independent(image_folder, tmp_path):
    copy = shutil.copytree(image_folder, tmp_path / "copy")
    (copy / "train" / "red" / "0000.jpg").unlink()
    assert len(load_split(str(copy), "train")) == 47
    assert len(load_split(str(image_folder), "train")) == 48


def _write_fake_cifar10(root, per_batch: int = 4) -> np.ndarray:
    """torchvision's CIFAR-10 pickle layout with a few random images; returns the test images
    as (N, 32, 32, 3)."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    test_images = None
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        chw = rng.integers(0, 256, (per_batch, 3, 32, 32), dtype=np.uint8)
        entry = {"data": chw.reshape(per_batch, -1), "labels": list(range(per_batch))}
        (folder / name).write_bytes(pickle.dumps(entry))
        test_images = chw.transpose(0, 2, 3, 1)
    names = ["airplane", "automobile", "bird", "cat", "deer"]
    names += ["dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    return test_images


def test_torchvision_cifar10_arrays(tmp_path, monkeypatch):
    """--data cifar10 reads torchvision's CIFAR-10 files (md5 checks off for the fakes)."""
    from torchvision.datasets import cifar

    expected = _write_fake_cifar10(tmp_path)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)
    train = load_split("cifar10", "train", data_root=tmp_path, download=False)
    test = load_split("CIFAR10", "test", data_root=tmp_path, download=False)
    assert len(train) == 20 and len(test) == 4
    assert train.class_names[:3] == ["airplane", "automobile", "bird"]
    assert np.array_equal(test.image(2), expected[2]) and test[2][1] == 2
    assert test.with_transform(EvalTransform(CIFAR_PRE))[0][0].shape == (3, 32, 32)


def test_missing_cifar_without_download_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar100 is not in .* downloading it is off"):
        load_split("cifar100", "train", data_root=tmp_path, download=False)


def test_a_failed_download_removes_only_the_folders_it_made(tmp_path, monkeypatch):
    """Every command reads CIFAR through load_split: a download that fails (no internet) leaves
    no empty data/ folder behind, and a folder the user had is kept."""
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", OfflineCifar)
    with pytest.raises(FileNotFoundError, match="could not be downloaded"):
        load_split("cifar10", "train", data_root=tmp_path / "new" / "cifar")
    assert list(tmp_path.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(FileNotFoundError, match="could not be downloaded"):
        load_split("cifar10", "test", data_root=mine / "cifar")
    assert list(tmp_path.iterdir()) == [mine] and list(mine.iterdir()) == []


def test_decoded_images_are_kept_on_disk_and_redecoded_when_a_file_changes(
    image_folder, tmp_path, monkeypatch
):
    folder = tmp_path / "data"
    shutil.copytree(image_folder, folder)
    cache = tmp_path / "cache"
    first = load_split(str(folder), "train", cache=True, cache_dir=cache)
    assert len(list(cache.glob("decoded-*.npy"))) == 1

    def no_decoding(path):
        raise AssertionError(f"decoded {path} again")

    monkeypatch.setattr("vit.data.datasets.load_image", no_decoding)
    again = load_split(str(folder), "train", cache=True, cache_dir=cache)
    assert np.array_equal(np.stack(first.images), again.images)
    monkeypatch.undo()

    changed = sorted((folder / "train" / "red").iterdir())[0]
    Image.new("RGB", (32, 32), (1, 2, 3)).save(changed)
    updated = load_split(str(folder), "train", cache=True, cache_dir=cache)
    index = updated.paths.index(changed)
    # decoded anew, not the stale copy (JPEG moves a flat colour by a level or two at most)
    assert np.abs(updated.images[index].astype(int) - (1, 2, 3)).max() <= 3
    assert len(list(cache.glob("decoded-*.npy"))) == 2


def _sigint_ignored(image: np.ndarray) -> torch.Tensor:
    """A transform reporting whether the loader worker it runs in ignores SIGINT."""
    import signal

    return torch.tensor(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)


def test_loader_workers_leave_ctrl_c_to_the_main_process():
    """Seen on a GPU: Ctrl-C (or the SIGINT of a time box) killed the workers too, and the
    pin-memory thread printed a traceback over train.py's one line."""
    from vit.data.loaders import eval_loader
    from vit.training.settings import TrainConfig
    from vit.training.train_loader import build_train_loader
    from vit.utils.process_group import DistInfo

    images = np.zeros((8, 8, 8, 3), dtype=np.uint8)
    dataset = ImageDataset(labels=[0, 1] * 4, class_names=["a", "b"], images=images)
    dataset = dataset.with_transform(_sigint_ignored)
    cfg = TrainConfig(batch_size=4, workers=1)
    train = build_train_loader(
        cfg, train_set=dataset, preprocess=None, info=DistInfo(), device=torch.device("cpu")
    )
    test = eval_loader(dataset, batch_size=4, workers=1, info=DistInfo(), pin=False)
    for loader in (train, test):
        ignored, _ = next(iter(loader))
        assert ignored.tolist() == [True] * 4


def test_test_images_come_from_memory_where_the_eval_transform_only_normalises():
    """With --batch-augment the test images are evaluated from memory when the evaluation
    transform would leave their pixels as they are (at the input size, a resize that keeps it);
    a resize or a crop keeps the DataLoader of the transform itself."""
    from vit.data.batch_pipeline import InMemoryEvalBatches
    from vit.models.registry import Preprocess
    from vit.training.settings import TrainConfig
    from vit.training.train_loader import build_test_loader
    from vit.utils.process_group import DistInfo

    def loader(side: int, crop_pct: float = 1.0, batch_augment: bool = True):
        images = np.zeros((8, side, side, 3), dtype=np.uint8)
        dataset = ImageDataset(labels=[0, 1] * 4, class_names=["a", "b"], images=images)
        preprocess = Preprocess(input_size=(32, 32), crop_pct=crop_pct)
        cfg = TrainConfig(batch_size=4, workers=0, batch_augment=batch_augment)
        cpu = torch.device("cpu")
        return build_test_loader(cfg, dataset, preprocess, info=DistInfo(), device=cpu)

    assert isinstance(loader(32), InMemoryEvalBatches)
    # at the input size and crop_pct 1, every crop mode only normalises: the values from memory
    image = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    for mode in ("center", "squash", "border"):
        preprocess = Preprocess(input_size=(32, 48), crop_pct=1.0, crop_mode=mode)
        mean, std = torch.tensor(preprocess.mean), torch.tensor(preprocess.std)
        pixels = torch.from_numpy(image).permute(2, 0, 1) / 255  # (3, H, W)
        normalised = (pixels - mean.view(3, 1, 1)) / std.view(3, 1, 1)
        torch.testing.assert_close(EvalTransform(preprocess)(image), normalised)
    assert not isinstance(loader(32, crop_pct=0.9), InMemoryEvalBatches)  # resized to 35, cropped
    assert not isinstance(loader(40), InMemoryEvalBatches)  # resized to 32
    assert not isinstance(loader(32, batch_augment=False), InMemoryEvalBatches)


def test_the_transforms_import_without_reaching_the_network():
    """albumentations asked PyPI for its latest version at every import of the transforms (up
    to 2 s, a warning line offline): the package turns that off unless the user set it."""
    probe = (
        "import urllib.request\n"
        "asked = []\n"
        "def refuse(self, url, *args, **kwargs):\n"
        "    asked.append(getattr(url, 'full_url', url))\n"
        "    raise OSError('no network')\n"
        "urllib.request.OpenerDirector.open = refuse\n"
        "import vit.data.transforms\n"
        "print(asked)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_decoded_images_that_cannot_be_kept_cost_the_run_nothing(tmp_path, monkeypatch, caplog):
    """A full disk (or an unwritable cache folder) stopped the run at its start: the cache only
    saves the next run time, so the images come back decoded and a warning says so."""
    import vit.data.datasets as datasets

    paths = []
    for i in range(3):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(tmp_path / f"{i}.png")
        paths.append(tmp_path / f"{i}.png")

    def full_disk(path, write):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(datasets, "atomic_write", full_disk)
    dataset = ImageDataset(paths=paths, labels=[0, 1, 2], class_names=["a", "b", "c"])
    dataset.cache(workers=1, cache_dir=tmp_path / "cache")
    assert [int(image[0, 0, 0]) for image in dataset.images] == [0, 1, 2]
    assert "the decoded images were not kept for the next run: [Errno 28]" in caplog.text


def test_a_full_disk_is_one_error_naming_the_file_and_the_old_one_stays(tmp_path, monkeypatch):
    """torch.save on a full disk says only "basic_ios::clear: iostream error": the writer's
    failure comes back as ENOSPC naming the file, the temporary file removed, the old kept."""
    import errno
    import shutil as shutil_module

    import vit.utils.files as files

    target = tmp_path / "model.pt"
    target.write_text("the last good one")

    def torch_save_on_a_full_disk(path):
        path.write_bytes(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    usage = shutil_module.disk_usage(tmp_path)
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: usage._replace(free=4096))
    with pytest.raises(OSError) as raised:
        files.atomic_write(target, torch_save_on_a_full_disk)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert target.read_text() == "the last good one" and list(tmp_path.iterdir()) == [target]
    monkeypatch.undo()  # space enough: the writer's own error, as it was
    with pytest.raises(RuntimeError, match="unexpected pos"):
        files.atomic_write(target, torch_save_on_a_full_disk)


def test_in_memory_batches_keep_non_square_images_and_resize_them_in_proportion():
    """The default size was the width: every batch of 16x24 images was stretched to 24x24."""
    from vit.data.batch_pipeline import InMemoryBatches

    images = np.random.default_rng(0).integers(0, 256, size=(8, 16, 24, 3), dtype=np.uint8)
    batches = InMemoryBatches(images, np.arange(8), batch_size=4, mean=(0.5,) * 3, std=(0.25,) * 3)
    for size, shape in [(None, (16, 24)), (16, (16, 24)), (8, (8, 12))]:
        batches.set_epoch(0, size)
        x, _ = next(iter(batches))
        assert tuple(x.shape) == (4, 3, *shape)


def test_files_written_together_are_put_in_place_together_through_a_ctrl_c(
    tmp_path, monkeypatch, request
):
    """A Ctrl-C between the renames of a report and its matrix left the new report beside the
    old matrix: it now takes effect once both are in place."""
    import signal

    import vit.utils.files as files

    report, matrix = tmp_path / "r.json", tmp_path / "r.png"
    report.write_text("old"), matrix.write_text("old")
    replace = files.os.replace

    def interrupted_between(source, target):
        replace(source, target)
        if Path(target) == matrix:  # the first of the two renames
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(files.os, "replace", interrupted_between)
    # Python's Ctrl-C, also where the suite runs as a background job (SIGINT ignored there)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    def write(folder):
        (folder / "r.json").write_text("new"), (folder / "r.png").write_text("new")

    with pytest.raises(KeyboardInterrupt):
        files.atomic_write_files([report, matrix], write)
    assert (report.read_text(), matrix.read_text()) == ("new", "new")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]


def test_the_decode_cache_key_takes_a_name_that_is_not_utf8(tmp_path):
    """train.py's decoded-images cache is named by a digest of the paths: a Latin-1 file name
    (surrogate escapes) stopped every cached run with "'utf-8' codec can't encode", naming no
    file. Its bytes count now; a UTF-8 name's digest is what it was (caches stay valid)."""
    latin, plain = tmp_path / os.fsdecode(b"caf\xe9.png"), tmp_path / "cafe.png"
    for path in (latin, plain):
        path.write_bytes(b"x")
    assert files_digest([latin]) != files_digest([plain])
    stat = os.stat(plain)
    line = f"{os.path.abspath(plain)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
    assert files_digest([plain]) == hashlib.sha256(line).hexdigest()[:32]
