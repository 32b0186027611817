"""The CPU recipe's levers, one change at a time, at a fixed short budget on real CIFAR-10.

    python benchmarks/cpu_ablation.py --data ../shared/data/cifar10-jpg            # every row
    python benchmarks/cpu_ablation.py --data ... --rows baseline batch-augment   # some rows

Each row is a whole `train.py` command (printed, so it can be run alone): 2 epochs on 25,000
training images, scored on all 10,000 test images after the last epoch. The wall time is the
whole command's (start-up, data, training, evaluation, saving); the decoded-image cache is
warmed once before the first row so that no row pays for decoding. Rows run one after
another: nothing else should run beside them (two cores are shared by everything).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

from vit.data import load_split
from vit.engine import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
# 2 epochs on 25,000 training images (stratified), scored on all 10,000 test images; one thread
# per process (the quick config's measured setting: two threads stall each other on 2 cores).
BASE = [
    "--config", "configs/cifar10_cpu_quick.yaml", "--epochs", "2", "--eval-interval", "2",
    "--train-subset", "25000", "--threads", "1",
]  # fmt: skip
FAST = ["--batch-augment"]
SMALL = ["embed_dim=128", "depth=4", "num_heads=4"]  # the quick config's model
TWO_PROCESSES = ["--batch-size", "32"]  # 2 x 32 = the baseline's 64 images

# name -> (processes, flags after BASE, what changes against the row it builds on)
ROWS = {
    "baseline": (1, [], "cifar10_cpu_quick.yaml: albumentations per image, 1 process"),
    "batch-augment": (1, FAST, "baseline + uint8 batches augmented in memory"),
    "2-processes": (2, FAST + TWO_PROCESSES, "batch-augment + 2 DDP processes x 1 thread"),
    "batch-128": (2, FAST, "2-processes + batch 2 x 64 = 128"),
    "patch-drop": (2, FAST + TWO_PROCESSES + ["--patch-drop", "0.5"], "2-processes + drop 50%"),
    "progressive": (
        2,
        FAST + TWO_PROCESSES + ["--progressive-size", "16"],
        "2-processes + 16 px growing to 32 px over the first half",
    ),
    "label-smoothing": (
        2,
        FAST + TWO_PROCESSES + ["--label-smoothing", "0.1"],
        "2-processes + label smoothing 0.1",
    ),
    "avg-pool": (
        2,
        FAST + TWO_PROCESSES + ["--model-kwargs", *SMALL, "global_pool=avg", "class_token=false"],
        "2-processes + average pooling of the patch tokens, no class token",
    ),
    "wider": (
        2,
        FAST + TWO_PROCESSES + ["--model-kwargs", "embed_dim=192", "depth=6", "num_heads=3"],
        "2-processes + 192-d, 6 blocks, 3 heads (1.8M)",
    ),
}


def command(processes: int, flags: list[str], data: str, out: Path) -> list[str]:
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    # --overwrite: a rerun of the benchmark replaces the rows it runs again
    return launcher + [
        "train.py",
        *BASE,
        "--data",
        data,
        *flags,
        "--output-dir",
        str(out),
        "--overwrite",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="CIFAR-10 image folder (train/, test/)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--out", type=Path, default=Path("runs/ablation"))
    args = parser.parse_args()

    for split in ("train", "test"):  # decode once into the cache every row reads
        load_split(args.data, split, cache_dir=Path(TrainConfig.cache_dir).expanduser())
    results = []
    for name in args.rows:
        processes, flags, change = ROWS[name]
        cmd = command(processes, flags, args.data, args.out / name)
        print("$", " ".join(cmd), flush=True)
        started = time.perf_counter()
        (ROOT / args.out).mkdir(parents=True, exist_ok=True)
        with open(ROOT / args.out / f"{name}.log", "w") as log:  # progress bars and logs
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
        minutes = (time.perf_counter() - started) / 60
        with open(ROOT / args.out / name / "metrics.csv") as f:
            last = list(csv.DictReader(f))[-1]
        top1 = float(last["ema_top1"] or last["test_top1"])
        results.append((name, change, top1, minutes, float(last["train_images_per_s"])))
        print(f"{name}: top-1 {100 * top1:.2f}% in {minutes:.1f} min", flush=True)
    print("\n| row | change | test top-1 | wall time | train img/s |\n|---|---|---:|---:|---:|")
    for name, change, top1, minutes, speed in results:
        print(f"| {name} | {change} | {100 * top1:.2f}% | {minutes:.1f} min | {speed:.0f} |")


if __name__ == "__main__":
    main()
