"""Faithfulness of attention maps on real CIFAR-10 test images: a markdown table.

For each method, patches are blanked (set to the dataset mean colour, 0 after normalisation)
10% at a time in the order the map ranks them, and top-1 accuracy against the true labels is
recorded from 0% to 100% removed. Positive perturbation removes the most relevant patches
first: a faithful map makes accuracy collapse, so a LOWER area under the curve is better.
Negative perturbation removes the least relevant first: a HIGHER area is better. A random map
is the baseline every method must beat. Maps explain the predicted class (the default).

    python benchmarks/faithfulness.py                       # 1000 test images, about 3 minutes
    python benchmarks/faithfulness.py --num-images 200 --weights path/to/model.safetensors
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import _cli
import torch
from PIL import Image

import vit
from vit.cli.flags import number_in
from vit.explain import (
    attention_rollout,
    faithfulness,
    gradient_rollout,
    last_block_attention,
    random_map,
    relevance,
)
from vit.utils.ranges import AT_LEAST_1

ROOT = Path(__file__).resolve().parents[1]
CLASSES = "airplane automobile bird cat deer dog frog horse ship truck".split()


def load_test_images(
    folder: Path, num_images: int, model: vit.VisionTransformer
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first num_images / 10 test images of each class (sorted file names), as the model's
    preprocessing prepares them: images (B, C, H, W) and labels (B,). Every class gives as many
    as the one with fewest has, at most: fewer images than asked, but balanced."""
    names = getattr(model, "class_names", None) or CLASSES
    transform = vit.create_transform(model.preprocess)
    found = [sorted((folder / name).glob("*.jpg")) for name in names]
    for name, files in zip(names, found, strict=True):
        if not files:
            raise FileNotFoundError(f"no .jpg images in {folder / name}")
    per_class = min(-(-num_images // len(names)), *map(len, found))  # ceiling division
    images, labels = [], []
    for label, files in enumerate(found):
        for file in files[:per_class]:
            with Image.open(file) as image:
                images.append(transform(image.convert("RGB")))
            labels.append(label)
    # Interleave the classes so that --num-images below 10 per class stays balanced.
    order = torch.arange(len(labels)).reshape(len(names), -1).T.flatten()[:num_images]
    return torch.stack(images)[order], torch.tensor(labels)[order]


def last_block_heads_mean(model: vit.VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """Raw attention of the last block (heads averaged), read like the rollout: (B, gh, gw)."""
    return last_block_attention(model, images).mean(dim=1)


def in_batches(method, model, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    return torch.cat(
        [method(model, images[i : i + batch_size]) for i in range(0, len(images), batch_size)]
    )


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--weights", default=ROOT / "weights/cifar10_vit_cpu.safetensors")
    parser.add_argument("--data", default=ROOT.parent / "shared/data/cifar10-jpg/test")
    count = number_in(AT_LEAST_1)  # no image, batch or thread: nothing measured
    parser.add_argument("--num-images", type=count, default=1000)
    parser.add_argument("--batch-size", type=count, default=250)
    # One thread: these small models gain little from intra-op threads, and on CPU cores shared
    # with other jobs two threads ran this script 2.5x slower than one.
    parser.add_argument("--threads", type=count, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    model = _cli.checked_model(parser, "--weights", args.weights)
    try:
        images, labels = load_test_images(Path(args.data), args.num_images, model)
    except FileNotFoundError as e:  # not a folder, or a class folder without images
        parser.error(f"--data {args.data}: {e}; accepted: a folder of class folders of .jpg")
    with torch.no_grad():
        clean = in_batches(lambda m, x: m(x), model, images, args.batch_size).argmax(1) == labels

    methods = {
        "random (baseline)": lambda m, x: random_map(x, m.grid_size, seed=0),
        "last-block attention": last_block_heads_mean,
        "attention rollout (mean)": attention_rollout,
        "attention rollout (max, discard 0.9)": lambda m, x: attention_rollout(m, x, "max", 0.9),
        "gradient rollout": gradient_rollout,
        "relevance (Chefer et al. 2021)": relevance,
    }
    rows = []
    for name, method in methods.items():
        t0 = time.perf_counter()
        maps = in_batches(method, model, images, args.batch_size)
        result = faithfulness(model, images, labels, maps, batch_size=args.batch_size)
        rows.append((name, result, time.perf_counter() - t0))
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    command = "python benchmarks/faithfulness.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print(
        f"`{command.strip()}`: {Path(args.weights).name}, {len(images)} CIFAR-10 test images "
        f"(clean accuracy {clean.float().mean():.1%}), patches blanked 10% at a time.\n"
    )
    print("| method | positive AUC (lower is better) | negative AUC (higher is better) |")
    print("|---|---:|---:|")
    for name, result, _ in rows:
        print(f"| {name} | {result.positive_auc:.3f} | {result.negative_auc:.3f} |")
    print("\naccuracy at 0%, 10%, ..., 100% removed (positive / negative):")
    for name, result, _ in rows:
        pos = " ".join(f"{v:.2f}" for v in result.positive_curve.tolist())
        neg = " ".join(f"{v:.2f}" for v in result.negative_curve.tolist())
        print(f"  {name}\n    + {pos}\n    - {neg}")
    print(
        f"\nwall time {time.perf_counter() - start:.0f} s on {torch.get_num_threads()} CPU threads"
    )


if __name__ == "__main__":
    _cli.run(main)
