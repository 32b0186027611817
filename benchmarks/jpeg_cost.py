"""What the JPEG copy of CIFAR-10 costs: how far its pixels are from the lossless images, and
copies of it compressed once more, to train on and measure how accuracy falls with the error.

    python benchmarks/jpeg_cost.py --data ../shared/data/cifar10-jpg --lossless DIR
    python benchmarks/jpeg_cost.py --data ../shared/data/cifar10-jpg --write /tmp/q50 --quality 50

`../shared/data/cifar10-jpg` is CIFAR-10 saved once as JPEG, training and test images alike,
and this machine has no lossless copy to train on. What it can measure is the dose: with
--lossless, a folder of some of the lossless test images named as foolbox ships them
(`cifar10_<test index>_<label>.png`, the first 20 of the test set in foolbox's wheel), it
checks how the copy was made (the copy's pixels against PIL's JPEG of the lossless image at
each quality, 4:2:0 chroma) and prints the copy's error against the lossless pixels; with
--write, it compresses the whole copy once more at --quality into a new image-folder tree
(with --colour-block N, its colour averaged over NxN pixels first) and prints the error that
adds. Training the same network on such a copy (teacher_screen.py --data
DST) says what an error of that size costs in accuracy, which is the measure of what the copy's
own error costs against the lossless images.
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import _cli
import numpy as np
from PIL import Image

from vit.data.images import load_image
from vit.utils.files import check_marked, marked_write_dir

LOSSLESS_NAME = re.compile(r"cifar10_(\d+)_(\d)\.png")
QUALITIES = (95, 90, 85, 80, 75, 70, 60, 50, 40, 30, 25)
# written first into DST.partial: the folder is this script's own, a stopped run's to remove
PARTIAL_MARK = ".jpeg_cost-partial"


def jpeg(pixels: np.ndarray, quality: int) -> bytes:
    """PIL's JPEG of an (H, W, 3) uint8 image with 4:2:0 colour, as the copy was saved (given
    explicitly so that every quality here subsamples alike)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality, subsampling="4:2:0")
    return buffer.getvalue()


def average_colour(pixels: np.ndarray, block: int) -> np.ndarray:
    """The colour planes (Cb, Cr) averaged over block x block pixels and spread back bilinearly,
    the brightness (Y) kept: what 4:2:0 does to colour (block 2), made coarser. (H, W, 3) uint8."""
    if block == 1:
        return pixels
    brightness, *colour = Image.fromarray(pixels).convert("YCbCr").split()
    coarse = (pixels.shape[1] // block, pixels.shape[0] // block)
    colour = [c.resize(coarse, Image.BOX).resize(brightness.size, Image.BILINEAR) for c in colour]
    return np.asarray(Image.merge("YCbCr", (brightness, *colour)).convert("RGB"))


def decode(data: bytes) -> np.ndarray:
    """(H, W, 3) uint8 of JPEG bytes in memory (`load_image` reads files)."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def mse(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared error per channel value, in 0-255 units."""
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def mean_mse(images: list[np.ndarray], references: list[np.ndarray]) -> float:
    return float(np.mean([mse(a, b) for a, b in zip(images, references, strict=True)]))


def psnr(error: float) -> float:
    return 10 * np.log10(255**2 / error) if error > 0 else float("inf")


def copy_paths(data: Path, split: str) -> list[Path]:
    """Every image of a split, class by class."""
    return sorted((data / split).glob("*/*.jpg"))


def copy_files_of(data: Path, lossless: list[tuple[int, int]]) -> dict[int, Path]:
    """Test index -> the copy's file, for a run of test indices 0..N-1: the copy numbers each
    class's images in test-set order, so the k-th image of a class is <class>/k.jpg; ValueError
    for another run."""
    indices = [index for index, _ in lossless]
    if indices != list(range(len(indices))):
        raise ValueError(f"--lossless: expected test indices 0..{len(indices) - 1}, got {indices}")
    classes = sorted(p.name for p in (data / "test").iterdir() if p.is_dir())
    seen = [0] * len(classes)
    files = {}
    for index, label in lossless:
        files[index] = data / "test" / classes[label] / f"{seen[label]:04d}.jpg"
        seen[label] += 1
    return files


def lossless_pairs(data: Path, folder: Path) -> list[tuple[Path, Path]]:
    """(lossless image, the copy's file of it), in test order; ValueError naming --lossless
    where the folder has none or they are not the first of the test set."""
    found = sorted(
        (int(m[1]), int(m[2]), path)
        for path in folder.glob("cifar10_*.png")
        if (m := LOSSLESS_NAME.fullmatch(path.name))
    )
    if not found:
        raise ValueError(f"--lossless {folder}: no cifar10_<index>_<label>.png images there")
    files = copy_files_of(data, [(index, label) for index, label, _ in found])
    return [(path, files[index]) for index, _, path in found]


def compare_with_lossless(pairs: list[tuple[Path, Path]], qualities: tuple[int, ...]) -> list[dict]:
    """A row per quality: PIL's JPEG of the lossless images against them, how many decode to
    the copy's pixels exactly, and the copy compressed once more at that quality (`pairs`:
    `lossless_pairs`)."""
    lossless = [load_image(path) for path, _ in pairs]
    copy = [load_image(path) for _, path in pairs]
    rows = []
    for quality in qualities:
        encoded = [jpeg(x, quality) for x in lossless]
        once = [decode(e) for e in encoded]
        twice = [decode(jpeg(c, quality)) for c in copy]
        rows.append({
            "quality": quality,
            "bytes": float(np.mean([len(e) for e in encoded])),
            "mse_once": mean_mse(once, lossless),
            "equal_to_copy": sum(map(np.array_equal, once, copy)),
            "mse_twice": mean_mse(twice, lossless),
            "mse_added": mean_mse(twice, copy),
        })  # fmt: skip
    copy_error = mean_mse(copy, lossless)
    print(f"{len(pairs)} lossless test images (0-{len(pairs) - 1}): the copy's MSE against them "
          f"{copy_error:.2f} ({psnr(copy_error):.2f} dB)")  # fmt: skip
    print("| quality | bytes | JPEG of lossless: MSE | dB | decodes to the copy | the copy again: "
          "MSE against lossless | against the copy |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        once = f"{r['mse_once']:.2f} | {psnr(r['mse_once']):.2f}"
        print(
            f"| {r['quality']} | {r['bytes']:.0f} | {once} | {r['equal_to_copy']} of {len(pairs)} "
            f"| {r['mse_twice']:.2f} | {r['mse_added']:.2f} |"
        )
    return rows


def write_copy(data: Path, destination: Path, quality: int, colour_block: int = 1) -> None:
    """Every image of the copy, its colour averaged over colour_block pixels if more than 1,
    saved again at `quality` under `destination`/{train,test}/<class>/; written beside it first
    and renamed when whole, so that a stopped run leaves no half-written copy. A DST.partial
    is removed only where this script marked it as its own (a run killed part-way).
    `write_problem` says why `destination` cannot be written, before any work."""
    start = time.perf_counter()
    marked_write_dir(
        destination,
        partial_folder(destination),
        PARTIAL_MARK,
        lambda folder: write_images(data, folder, quality, colour_block),
    )
    print(f"written to {destination} in {time.perf_counter() - start:.0f} s")


def partial_folder(destination: Path) -> Path:
    """Where `write_copy` writes `destination` first."""
    return destination.with_name(destination.name + ".partial")


def write_problem(destination: Path) -> str | None:
    """Why --write `destination` cannot be written (None if it can): it exists, or its
    DST.partial is not this script's."""
    if destination.exists():
        return f"--write {destination}: already exists; give a new folder"
    try:
        check_marked(partial_folder(destination), PARTIAL_MARK)
    except FileExistsError as e:
        return f"--write {destination}: {e}"
    return None


def write_images(data: Path, partial: Path, quality: int, colour_block: int) -> None:
    """write_copy's work: every image of `data` saved again under `partial`."""
    for split in ("train", "test"):
        errors = []
        for path in copy_paths(data, split):
            pixels = load_image(path)
            encoded = jpeg(average_colour(pixels, colour_block), quality)
            errors.append(mse(decode(encoded), pixels))
            target = partial / split / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(encoded)
        error = float(np.mean(errors))
        colour = f", colour averaged over {colour_block}x{colour_block}" if colour_block > 1 else ""
        print(
            f"{split}: {len(errors)} images at quality {quality}{colour}, MSE against the copy "
            f"{error:.2f} ({psnr(error):.2f} dB)"
        )


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--data", type=Path, required=True, help="the JPEG copy's image folder")
    parser.add_argument(
        "--lossless", type=Path, default=None, help="cifar10_<i>_<label>.png folder"
    )
    parser.add_argument("--write", type=Path, default=None, help="a new folder for the copy")
    parser.add_argument("--quality", type=int, default=50, help="--write's JPEG quality, 1-100")
    parser.add_argument(
        "--colour-block", type=int, default=1, help="--write: average colour over NxN pixels first"
    )
    parser.add_argument("--qualities", type=int, nargs="+", default=list(QUALITIES))
    args = parser.parse_args(argv)
    if not (args.data / "test").is_dir():
        parser.error(f"--data {args.data}: expected an image folder with train/ and test/")
    if args.lossless is None and args.write is None:
        parser.error("give --lossless DIR, --write DST or both")
    # every input checked before any work: a bad --quality or --write is not found after the
    # comparison
    if not 1 <= args.quality <= 100:
        parser.error(f"--quality {args.quality}: expected 1-100")
    for quality in args.qualities:
        if not 1 <= quality <= 100:
            parser.error(f"--qualities {quality}: expected 1-100")
    if args.colour_block not in (1, 2, 4, 8):
        parser.error(f"--colour-block {args.colour_block}: expected 1, 2, 4 or 8")
    if args.write is not None:
        problem = write_problem(args.write)
        if problem:
            parser.error(problem)
    if args.lossless is not None:
        try:
            pairs = lossless_pairs(args.data, args.lossless)
        except ValueError as e:
            parser.error(str(e))
        compare_with_lossless(pairs, tuple(args.qualities))
    if args.write is not None:
        write_copy(args.data, args.write, args.quality, args.colour_block)


if __name__ == "__main__":
    _cli.run(main)
