"""Classify images from the command line.

    python -m vit.predict IMAGE [IMAGE ...] --model NAME [--checkpoint PATH] [--top-k 5]

With only --model, timm's pretrained weights for that name are used (downloaded once). With
--checkpoint, the weights come from that file; our own `.safetensors` files know their
architecture and class names, so --model may be left out for them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from .configs import list_models
from .factory import create_model, create_transform, load_model
from .model import VisionTransformer
from .weights import read_metadata


class InputError(Exception):
    """A problem with what the user passed, reported as one line without a traceback."""


def load_image(path: Path) -> Image.Image:
    """Open an image as RGB: grayscale is replicated, transparency is composited on white."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected an image file")
    try:
        with Image.open(path) as image:
            image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise InputError(f"{path}: not an image that can be read ({e})") from None
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def class_names_for(model: VisionTransformer) -> list[str]:
    """Stored names for our checkpoints, ImageNet's for 1000-class heads, else indices."""
    names = getattr(model, "class_names", None)
    if names:
        return list(names)
    if model.num_classes == 1000:
        from timm.data import ImageNetInfo  # ships with timm: no download

        info = ImageNetInfo()
        return [info.index_to_description(i) for i in range(1000)]
    return [f"class {i}" for i in range(model.num_classes)]


def build_model(name: str | None, checkpoint: Path | None) -> VisionTransformer:
    if checkpoint is not None:
        if not checkpoint.is_file():
            raise InputError(f"--checkpoint {checkpoint}: no such file")
        if checkpoint.suffix == ".safetensors" and "vit.config" in read_metadata(checkpoint):
            return load_model(checkpoint)
        if name is None:
            raise InputError(
                f"--checkpoint {checkpoint} does not record its architecture: pass --model NAME"
            )
        return create_model(name, pretrained=checkpoint)
    if name is None:
        raise InputError("pass --model NAME (timm's pretrained weights) or --checkpoint PATH")
    return create_model(name, pretrained=True)


@torch.inference_mode()
def predict(model: VisionTransformer, images: list[Image.Image], top_k: int) -> tuple:
    """PIL images -> (probabilities, class indices), each (B, top_k), best first."""
    transform = create_transform(model.preprocess)
    batch = torch.stack([transform(image) for image in images])  # (B, 3, H, W)
    probs = model.eval()(batch).softmax(dim=-1)  # (B, num_classes)
    return probs.topk(min(top_k, probs.shape[-1]), dim=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vit.predict", description="Top-k classes for each image."
    )
    parser.add_argument("images", nargs="+", type=Path, help="image files (any PIL format)")
    parser.add_argument("--model", help=f"model name, one of: {', '.join(list_models())}")
    parser.add_argument("--checkpoint", type=Path, help="weights file (.safetensors/.pth/.npz)")
    parser.add_argument("--top-k", type=int, default=5, help="classes to show per image")
    args = parser.parse_args(argv)
    if args.top_k < 1:
        parser.error(f"--top-k must be at least 1, got {args.top_k}")
    if args.model is not None and args.model not in list_models():
        parser.error(f"unknown --model {args.model!r}; known: {', '.join(list_models())}")

    loaded, failed = [], []
    for path in args.images:
        try:
            loaded.append((path, load_image(path)))
        except InputError as e:
            failed.append(str(e))
    try:
        model = build_model(args.model, args.checkpoint)
    except (InputError, ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if loaded:
        names = class_names_for(model)
        probs, indices = predict(model, [image for _, image in loaded], args.top_k)
        for (path, _), row_p, row_i in zip(loaded, probs.tolist(), indices.tolist(), strict=True):
            print(path)
            for p, i in zip(row_p, row_i, strict=True):
                print(f"  {p:7.2%}  {names[i]}")
    for message in failed:
        print(f"error: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
