"""Images/s of the training augmentation alone (no model), side by side: the per-image
albumentations pipeline of configs/cifar10.yaml (pad-crop, flip, RandAugment x2, random erasing
0.25) on one core, against the in-memory batch pipeline with the same augmentations
(`InMemoryBatches(randaug_ops=2)`, `vit.data.batch_randaugment`) and without RandAugment, on the
CPU and, where there is one, on the GPU.

    python benchmarks/batch_augment_throughput.py [--batch-sizes 128 512] [--rounds 3]

Random 32x32 images stand in for CIFAR-10 (the cost does not depend on the pixels). Rows are
timed in alternating rounds, each reporting its median; on a GPU a round ends by waiting for
the GPU, so what it measures is the work, not its launch.
"""

from __future__ import annotations

import statistics
import time

import _cli
import numpy as np
import torch

import vit
from vit.data.batch_pipeline import InMemoryBatches
from vit.data.transforms import AugmentConfig, train_transform
from vit.data.workers import usable_cores

IMAGES = 8192


def per_image_rate(images: np.ndarray) -> float:
    """albumentations, one image at a time in this process (what one loader worker does)."""
    model = vit.create_model("vit_cifar_patch4_32", num_classes=10)
    augment = AugmentConfig(crop="pad", hflip=0.5, aa="randaug", aa_n=2, reprob=0.25)
    transform = train_transform(model.preprocess, augment)
    count = 1024
    started = time.perf_counter()
    for image in images[:count]:
        transform(image=image)
    return count / (time.perf_counter() - started)


def batch_rate(batches: InMemoryBatches) -> float:
    batches.set_epoch(batches.epoch + 1)
    started, seen = time.perf_counter(), 0
    for x, _ in batches:
        seen += len(x)
    if batches.device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (IMAGES, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, IMAGES)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows: dict[str, object] = {"albumentations, per image, 1 core": None}
    for device in devices:
        for batch_size in args.batch_sizes:
            for ops in (2, 0):
                name = f"in-memory batches of {batch_size} on {device.type}, RandAugment x{ops}"
                rows[name] = InMemoryBatches(
                    images, labels, batch_size=batch_size, mean=(0.5,) * 3, std=(0.25,) * 3,
                    pad=4, hflip=0.5, randaug_ops=ops, reprob=0.25, device=device,
                )  # fmt: skip
    for batches in rows.values():  # warm-up: allocations, kernels, the first launch
        if batches is not None:
            batch_rate(batches)
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, batches in rows.items():
            rate = per_image_rate(images) if batches is None else batch_rate(batches)
            rates[name].append(rate)
    machine = _cli.machine(devices[-1])
    print(f"cores={usable_cores()} torch threads={torch.get_num_threads()}; {machine}")
    print("| pipeline | images/s (median) |\n|---|---:|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} |")


if __name__ == "__main__":
    _cli.run(main)
