"""Image files: the one loader (train, evaluate and predict all decode through it) and the
expansion of files, folders and glob patterns into a list of images.

Every image becomes RGB the same way: grayscale is replicated to three channels, and images
with transparency (RGBA, LA, PA, or a palette with a transparent colour) are composited on
white, which is what a viewer shows (dropping alpha would reveal whatever colour the encoder
left under transparent pixels, often black).
"""

from __future__ import annotations

import glob
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm")
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
    transparent = image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info
    )
    if transparent:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def load_image(path: str | Path) -> np.ndarray:
    """Decode an image file to an RGB uint8 array (H, W, 3) (see `open_image`)."""
    return np.asarray(open_image(path), dtype=np.uint8)


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def images_in_folder(folder: Path) -> list[Path]:
    """Every image file under `folder`, searched recursively, sorted; hidden files skipped."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and is_image_file(p) and not p.name.startswith(".")
    )


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
