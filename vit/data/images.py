"""Image files: the one loader (train, evaluate and predict all decode through it) and the
expansion of files, folders and glob patterns into a list of images.

Every image becomes RGB the same way: grayscale is replicated to three channels, and images
with transparency (RGBA, LA, PA, or a transparent colour in a palette, RGB or greyscale image)
are composited on white, which is what a viewer shows (dropping alpha would reveal whatever
colour the encoder left under transparent pixels, often black).
"""

from __future__ import annotations

import glob
import multiprocessing
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".bmp",
    ".webp",
    ".gif",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
)
GLOB_CHARACTERS = frozenset("*?[")


class CorruptImageError(ValueError):
    """An image file that cannot be read or decoded; the message names its path."""


def open_image(path: str | Path) -> Image.Image:
    """Decode an image file to an RGB PIL image, or raise `CorruptImageError` naming the file."""
    path = Path(path)
    if path.is_dir():
        raise CorruptImageError(f"cannot read image {path}: it is a folder, not an image file")
    if not path.exists():
        raise CorruptImageError(f"cannot read image {path}: no such file")
    if not path.is_file():  # a pipe would be waited on for ever, a device read without end
        raise CorruptImageError(
            f"cannot read image {path}: not a regular file (a pipe, socket or device)"
        )
    try:
        with Image.open(path) as image:
            image.load()
    except (
        UnidentifiedImageError,
        OSError,
        SyntaxError,  # what some PIL plugins raise on damaged headers
        ValueError,
        Image.DecompressionBombError,
    ) as e:
        raise CorruptImageError(f"cannot read image {path}: {e}") from e
    sixteen_bit = image.mode == "I" or image.mode.startswith("I;16")
    # a transparent colour (PNG's tRNS) marks palette, RGB and greyscale images alike
    transparent = image.mode in ("RGBA", "LA", "PA") or (
        "transparency" in image.info and not sixteen_bit
    )
    if transparent:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if sixteen_bit:
        # 16-bit greyscale (PNG, TIFF): PIL's convert("RGB") clips every value above 255 to
        # white; scale 0..65535 to 0..255 instead
        levels = np.asarray(image, dtype=np.float64) / 257.0
        image = Image.fromarray(np.clip(levels.round(), 0, 255).astype(np.uint8), "L")
    return image.convert("RGB")


def load_image(path: str | Path) -> np.ndarray:
    """Decode an image file to an RGB uint8 array (H, W, 3) (see `open_image`)."""
    return np.asarray(open_image(path), dtype=np.uint8)


# From this many files on, `load_images` decodes in processes: starting them costs ~0.1 s.
MANY_FILES = 4096


def load_images(paths: Sequence[str | Path], workers: int) -> list[np.ndarray]:
    """Decode many image files (`load_image` each), in order, on `workers` cores.

    Many files are decoded in processes (forked, as DataLoader's workers are on Linux), a few
    in threads. Decoding a small JPEG is mostly PIL's Python, which holds the GIL: 5,000 CIFAR
    JPEGs decoded at 1,815 images/s in one thread and 2,145 in two (Zen 3, 2 cores), so
    threads could not use a GPU machine's 16 cores for the 60,000 images of a speedrun's start.
    A file that cannot be decoded raises `CorruptImageError` naming it, from a process too."""
    if (
        workers <= 1
        or len(paths) < MANY_FILES
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return load_images_in_threads(paths, max(workers, 1))
    # a few chunks per process: one pickled list back per chunk, and no process idles long
    # behind a slow one at the end
    size = -(-len(paths) // (4 * workers))  # ceil
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return [image for chunk in pool.map(load_chunk, chunks) for image in chunk]


def load_images_in_threads(paths: Sequence[str | Path], workers: int) -> list[np.ndarray]:
    """`load_image` of each file, in order, in `workers` threads (what a few files take)."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(load_image, paths, chunksize=256))


def load_chunk(paths: Sequence[str | Path]) -> list[np.ndarray]:
    return [load_image(path) for path in paths]


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def images_in_folder(folder: Path) -> list[Path]:
    """Every image file under `folder`, searched recursively, sorted. Linked folders are
    followed, as torchvision's ImageFolder does (a link back to a folder above it, once);
    hidden files and folders (.DS_Store, .ipynb_checkpoints/) are skipped."""
    found = []
    for root, folders, files in os.walk(folder, followlinks=True):
        here = Path(root)
        above = [folder / part for part in here.relative_to(folder).parents]
        if os.path.realpath(here) in {os.path.realpath(p) for p in above}:  # a link loop
            folders.clear()
            continue
        folders[:] = [name for name in folders if not name.startswith(".")]
        found += [
            here / name
            for name in files
            if not name.startswith(".") and is_image_file(here / name) and (here / name).is_file()
        ]
    return sorted(found)


def expand_image_paths(inputs: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """Files, folders (searched recursively) and glob patterns -> (image paths, problems).

    The order is the inputs' order (a folder's or pattern's matches sorted); a path named twice
    is kept once. A file named explicitly is kept whatever its extension, so that `open_image`
    reports it if it is not an image; folders and patterns contribute only files with one of
    `IMAGE_EXTENSIONS`. `problems` holds one message per input that yielded nothing: a missing
    path, a folder without images, a pattern that matches no image.
    """
    paths: list[Path] = []
    problems: list[str] = []
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir():
            found = images_in_folder(path)
            if not found:
                problems.append(
                    f"{path}: a folder without images (searched recursively for "
                    f"{', '.join(IMAGE_EXTENSIONS)})"
                )
        elif path.exists():
            found = [path]
        elif GLOB_CHARACTERS & set(text):
            matches = (Path(p) for p in glob.glob(text, recursive=True))
            found = sorted(p for p in matches if p.is_file() and is_image_file(p))
            if not found:
                problems.append(f"{text}: no image matches this pattern")
        else:
            found = []
            problems.append(f"cannot read image {path}: no such file")
        paths.extend(found)
    unique = list(dict.fromkeys(paths))
    return unique, problems
