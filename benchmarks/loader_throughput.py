"""Images/s of the training loader alone (no model): the GPU recipe's per-image albumentations
pipeline (configs/cifar10.yaml: pad-crop, flip, RandAugment x2, random erasing) in DataLoader
workers, with OpenCV's default threads in every worker (a thread per core, as train.py leaves
them) against N. (train.py does not set them: in a worker forked from a process whose OpenCV
pool had run, setting them deadlocked; here the parent has run no OpenCV before the fork.)

    python benchmarks/loader_throughput.py                          # 2 workers, 1 vs default
    python benchmarks/loader_throughput.py --workers 12 --opencv-threads 1 -1

On a GPU machine this says whether the loader can feed the step: set it beside the training
images/s that train.py logs (and its `data_seconds`, the loop's wait for batches). Random
32x32 images stand in for CIFAR-10 (the transform's cost does not depend on the pixels).
Settings are timed in alternating rounds, so a change in machine load hits each alike; each
reports its median round.
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import _cli
import cv2
import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader

import vit
from vit.cli.flags import number_in
from vit.data.datasets import ImageDataset
from vit.data.loaders import init_worker
from vit.data.transforms import train_transform
from vit.data.workers import usable_cores
from vit.training.settings import TrainConfig
from vit.utils.ranges import AT_LEAST_0, AT_LEAST_1, Range

ROOT = Path(__file__).resolve().parents[1]


class OpenCVThreads:
    """worker_init_fn: train.py's worker set-up, then OpenCV's threads as asked (-1: its
    default, as train.py leaves them)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def __call__(self, worker_id: int) -> None:
        default = cv2.getNumThreads()  # what a worker inherits
        init_worker(worker_id)
        cv2.setNumThreads(default if self.threads < 0 else self.threads)


def images_per_second(dataset: ImageDataset, workers: int, threads: int, batches: int) -> float:
    loader = DataLoader(
        dataset,
        batch_size=128,
        shuffle=True,
        num_workers=workers,
        worker_init_fn=OpenCVThreads(threads),
        drop_last=True,
    )
    batches_seen = iter(loader)
    next(batches_seen)  # the workers' start-up stays out of the timing
    started, images = time.perf_counter(), 0
    for images_batch, _ in itertools.islice(batches_seen, batches):
        images += len(images_batch)
    return images / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    count = number_in(AT_LEAST_1)  # no batch or round: no rate to give
    parser.add_argument(
        "--workers", type=number_in(AT_LEAST_0), nargs="+", default=[2], help="0: in this process"
    )
    parser.add_argument(
        "--opencv-threads",
        type=number_in(Range(-1, integer=True)),
        nargs="+",
        default=[1, -1],
        help="per worker; -1: default",
    )
    parser.add_argument("--batches", type=count, default=40, help="timed batches of 128 a round")
    parser.add_argument("--rounds", type=count, default=3)
    args = parser.parse_args(argv)

    recipe = yaml.safe_load((ROOT / "configs" / "cifar10.yaml").read_text())
    augment = ("crop", "hflip", "aa", "aa_n", "reprob")
    cfg = TrainConfig(**{key: value for key, value in recipe.items() if key in augment})
    model = vit.create_model("vit_cifar_patch4_32", num_classes=10)
    # a round's batches for each worker (one for none: --workers 0 loads in this process)
    count = 128 * (args.batches + 1) * max(1, *args.workers)
    rng = np.random.default_rng(0)
    dataset = ImageDataset(
        labels=rng.integers(0, 10, count).tolist(),
        class_names=[str(i) for i in range(10)],
        images=rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8),
        transform=train_transform(model.preprocess, cfg.augment()),
    )
    print(
        f"cores={usable_cores()} opencv default threads="
        f"{cv2.getNumThreads()} torch={torch.__version__} opencv={cv2.__version__}; "
        f"{_cli.machine()}"
    )
    settings = list(itertools.product(args.workers, args.opencv_threads))
    rates: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
    for _ in range(args.rounds):
        for workers, threads in settings:
            rates[(workers, threads)].append(
                images_per_second(dataset, workers, threads, args.batches)
            )
    print("| workers | OpenCV threads per worker | images/s (median) | per worker |")
    print("|---:|---|---:|---:|")
    for workers, threads in settings:
        rate = statistics.median(rates[(workers, threads)])
        label = "default" if threads < 0 else str(threads)
        print(f"| {workers} | {label} | {rate:,.0f} | {rate / max(workers, 1):,.0f} |")


if __name__ == "__main__":
    _cli.run(main)
