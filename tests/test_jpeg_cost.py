"""benchmarks/jpeg_cost.py: the JPEG copy's error against lossless images, and copies of it
compressed once more."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error
from PIL import Image

LABELS = [0, 1, 0, 2, 1, 0]  # the lossless test images 0-5, as foolbox names them
CLASSES = ["airplane", "automobile", "bird"]


@pytest.fixture
def jpeg_cost(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("jpeg_cost")


def refused(jpeg_cost, argv: list[str], capsys) -> str:
    """jpeg_cost.py's one line for a refused command (status 2), after its "error: "."""
    with pytest.raises(SystemExit) as exit_info:
        jpeg_cost.main(argv)
    return one_line_error(capsys, exit_info)


def smooth_image(rng: np.random.Generator) -> np.ndarray:
    """(32, 32, 3) uint8, smooth enough that JPEG's error depends on its quality."""
    coarse = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((32, 32), Image.BILINEAR))


@pytest.fixture
def copy_and_lossless(jpeg_cost, tmp_path) -> tuple[Path, Path]:
    """A lossless folder named as foolbox's, and an image-folder copy of the same images saved
    at quality 75, each class's images numbered in test order (two training images a class)."""
    rng = np.random.default_rng(0)
    lossless, copy = tmp_path / "lossless", tmp_path / "copy"
    lossless.mkdir()
    seen = [0] * len(CLASSES)
    for index, label in enumerate(LABELS):
        pixels = smooth_image(rng)
        Image.fromarray(pixels).save(lossless / f"cifar10_{index:02d}_{label}.png")
        target = copy / "test" / CLASSES[label] / f"{seen[label]:04d}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(jpeg_cost.jpeg(pixels, 75))
        seen[label] += 1
    for name in CLASSES:
        (copy / "train" / name).mkdir(parents=True)
        for k in range(2):
            Image.fromarray(smooth_image(rng)).save(copy / "train" / name / f"{k:04d}.jpg")
    return copy, lossless


def test_the_copy_is_matched_to_its_lossless_images_by_test_order(jpeg_cost, copy_and_lossless):
    copy, lossless = copy_and_lossless
    pairs = jpeg_cost.lossless_pairs(copy, lossless)
    rows = {r["quality"]: r for r in jpeg_cost.compare_with_lossless(pairs, (95, 75, 50))}
    # the copy's files are each lossless image's JPEG at 75: found only by the right numbering
    assert rows[75]["equal_to_copy"] == len(LABELS)
    assert rows[95]["equal_to_copy"] == 0 and rows[50]["equal_to_copy"] == 0
    assert rows[95]["mse_once"] < rows[75]["mse_once"] < rows[50]["mse_once"]
    # compressed again at 50, the copy moves from itself and further from the lossless images
    assert rows[50]["mse_added"] > 0 and rows[50]["mse_twice"] > rows[75]["mse_once"]


def test_lossless_images_must_be_the_first_of_the_test_set(jpeg_cost, copy_and_lossless, capsys):
    copy, lossless = copy_and_lossless
    (lossless / "cifar10_00_0.png").rename(lossless / "cifar10_07_0.png")
    line = refused(jpeg_cost, ["--data", str(copy), "--lossless", str(lossless)], capsys)
    assert line.startswith("--lossless: expected test indices 0..5")


def test_a_missing_data_folder_is_refused_in_one_line(jpeg_cost, tmp_path, capsys):
    argv = ["--data", str(tmp_path / "nope"), "--write", str(tmp_path / "q50")]
    assert refused(jpeg_cost, argv, capsys).startswith(f"--data {tmp_path / 'nope'}: expected")


def test_a_used_write_folder_is_refused_before_the_comparison(
    jpeg_cost, copy_and_lossless, tmp_path, capsys
):
    copy, lossless = copy_and_lossless
    (tmp_path / "q50").mkdir()
    argv = ["--data", str(copy), "--lossless", str(lossless), "--write", str(tmp_path / "q50")]
    assert (
        refused(jpeg_cost, argv, capsys)
        == f"--write {tmp_path / 'q50'}: already exists; give a new folder"
    )


def test_a_copy_compressed_again_keeps_the_tree_and_refuses_a_used_folder(
    jpeg_cost, copy_and_lossless, tmp_path, capsys
):
    copy, _ = copy_and_lossless
    destination = tmp_path / "q50"
    jpeg_cost.main(["--data", str(copy), "--write", str(destination), "--quality", "50"])
    relative = sorted(p.relative_to(copy) for p in copy.rglob("*.jpg"))
    assert sorted(p.relative_to(destination) for p in destination.rglob("*.jpg")) == relative
    for path in relative:
        again, before = jpeg_cost.load_image(destination / path), jpeg_cost.load_image(copy / path)
        assert again.shape == before.shape == (32, 32, 3) and not np.array_equal(again, before)
    assert "test: 6 images at quality 50, MSE against the copy" in capsys.readouterr().out
    written = (destination / relative[0]).read_bytes()
    argv = ["--data", str(copy), "--write", str(destination), "--quality", "30"]
    assert "already exists" in refused(jpeg_cost, argv, capsys)
    assert (destination / relative[0]).read_bytes() == written  # nothing overwritten


def test_averaging_the_colour_keeps_the_brightness(jpeg_cost):
    pixels = smooth_image(np.random.default_rng(1))
    assert jpeg_cost.average_colour(pixels, 1) is pixels
    coarse = jpeg_cost.average_colour(pixels, 8)
    before, after = (
        np.asarray(Image.fromarray(p).convert("YCbCr"), np.int16) for p in (pixels, coarse)
    )
    assert np.abs(after[..., 0] - before[..., 0]).max() <= 2  # Y: the RGB round trip's rounding
    assert np.abs(after[..., 1:] - before[..., 1:]).mean() > 2  # Cb, Cr: coarser
    grey = np.repeat(pixels[..., :1], 3, axis=2)  # no colour to average
    assert np.abs(jpeg_cost.average_colour(grey, 8).astype(np.int16) - grey).max() <= 1


def test_a_colour_block_other_than_a_power_of_two_up_to_8_is_refused(
    jpeg_cost, copy_and_lossless, tmp_path, capsys
):
    copy, _ = copy_and_lossless
    argv = ["--data", str(copy), "--write", str(tmp_path / "c3"), "--colour-block", "3"]
    assert refused(jpeg_cost, argv, capsys) == "--colour-block 3: expected 1, 2, 4 or 8"
    assert not (tmp_path / "c3").exists()


def test_a_stopped_write_leaves_no_copy_and_the_next_one_finishes(
    jpeg_cost, copy_and_lossless, tmp_path, monkeypatch
):
    copy, _ = copy_and_lossless
    destination, encode, calls = tmp_path / "q50", jpeg_cost.jpeg, []

    def stop_at_the_fifth(pixels, quality):
        calls.append(quality)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return encode(pixels, quality)

    monkeypatch.setattr(jpeg_cost, "jpeg", stop_at_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        jpeg_cost.write_copy(copy, destination, 50)
    assert not destination.exists()  # a half-written copy is never taken for a whole one
    monkeypatch.setattr(jpeg_cost, "jpeg", encode)
    jpeg_cost.write_copy(copy, destination, 50)
    assert len(list(destination.rglob("*.jpg"))) == len(list(copy.rglob("*.jpg")))
    assert not (tmp_path / "q50.partial").exists()


def test_a_partial_folder_the_script_did_not_make_is_kept(
    jpeg_cost, copy_and_lossless, tmp_path, capsys
):
    copy, _ = copy_and_lossless
    theirs = tmp_path / "q50.partial"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    line = refused(jpeg_cost, ["--data", str(copy), "--write", str(tmp_path / "q50")], capsys)
    assert "q50.partial exists and is not this script's" in line
    assert (theirs / "notes.txt").read_text() == "mine" and not (tmp_path / "q50").exists()


def test_a_quality_of_the_comparison_outside_1_to_100_is_refused(
    jpeg_cost, copy_and_lossless, capsys
):
    copy, lossless = copy_and_lossless
    argv = ["--data", str(copy), "--lossless", str(lossless), "--qualities", "75", "500"]
    assert refused(jpeg_cost, argv, capsys) == "--qualities 500: expected 1-100"
