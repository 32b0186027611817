"""Test top-1 of a training run against wall-clock minutes and against epochs (a PNG).

    python benchmarks/plot_cpu_recipe.py --run runs/cifar10-cpu --log weights/cifar10_vit_cpu.log \
        --out weights/cifar10_vit_cpu_curve.png --overwrite

An existing --out (the shipped figure above, say) is replaced only with --overwrite, and whole:
the image is written to a temporary file beside it, then renamed over it.

The minutes come from the timestamps train.py logs after each epoch, counted from the log's
`launched` line (written by the command that started the run) or else its first line. The
title and the run's label say what the run's config.yaml records (its data, test subset,
device, processes and threads). The
right panel adds omihub777/ViT-CIFAR's published plain ViT (6.3M parameters, patch 4, a
200-epoch schedule on a V100) at equal epochs, as the issue quotes it: about 77% after 20
epochs and 81% after 30. Those two points are theirs, not measured here.
"""

from __future__ import annotations

import contextlib
import csv
import re
from datetime import datetime
from pathlib import Path

import _cli
import yaml
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure

from vit.cli.flags import ArgumentParser, kept_output, unwritable
from vit.data.datasets import find_split_dir, scan_folder
from vit.utils.files import atomic_write

# the data sets train.py downloads by name: (title, test images)
NAMED_DATA = {"cifar10": ("CIFAR-10", 10_000), "cifar100": ("CIFAR-100", 10_000)}
REFERENCE = {"epochs": [20, 30], "top1": [77.0, 81.0]}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO epoch (\d+)/\d+:")
LAUNCHED = re.compile(r"^launched (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def epoch_minutes(log: Path) -> dict[int, float]:
    """{epoch: minutes since launch} from train.py's log lines."""
    start, minutes = None, {}
    for line in log.read_text(errors="replace").splitlines():
        if (m := LAUNCHED.match(line)) and start is None:
            start = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        elif m := STAMP.match(line):
            stamp = datetime.strptime(f"{m.group(1)}.{m.group(2)}", "%Y-%m-%d %H:%M:%S.%f")
            start = start or stamp
            minutes[int(m.group(3))] = (stamp - start).total_seconds() / 60
    if not minutes:
        raise SystemExit(f"{log} has no 'INFO epoch N/E:' lines from train.py")
    return minutes


def test_images(config: dict) -> str:
    """'CIFAR-10, all 10,000 test images', as far as the run's settings say."""
    data = str(config.get("data") or "")
    name, count = NAMED_DATA.get(data, (Path(data).name, None))
    if count is None:  # a folder, if here: the images its evaluation reads, no other file
        with contextlib.suppress(OSError, ValueError):  # not here, or not an image folder
            count = len(scan_folder(find_split_dir(Path(data), "test"))[0])
    if config.get("test_subset"):
        images = f"{config['test_subset']:,} test images"
    else:
        images = f"all {count:,} test images" if count else "all its test images"
    return f"{name}, {images}" if name else images.capitalize()


def run_label(config: dict) -> str:
    """'this run (cpu, 2 processes, 1 thread each)', as far as the run's settings say."""
    parts = [config["device"]] if config.get("device") not in (None, "auto") else []
    if config.get("processes"):
        parts.append(f"{config['processes']} process{'es' if config['processes'] > 1 else ''}")
    if config.get("threads"):
        parts.append(f"{config['threads']} thread{'s' if config['threads'] > 1 else ''} each")
    return "this run" + (f" ({', '.join(parts)})" if parts else "")


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="run folder with metrics.csv")
    parser.add_argument("--log", type=Path, required=True, help="train.py's output")
    parser.add_argument("--out", type=Path, required=True, help="the image (.png, .pdf, .svg ...)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args()
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = args.out.suffix.lower().lstrip(".")
    if suffix not in formats:
        parser.error(
            f"--out {args.out}: not an image file name matplotlib writes; accepted suffixes: "
            f"{', '.join('.' + name for name in sorted(formats))}"
        )
    if problem := unwritable("--out", args.out, folder=False) or kept_output(
        "--out", args.out, args.overwrite
    ):
        parser.error(problem)
    if not (args.run / "metrics.csv").is_file():
        parser.error(f"--run {args.run}: no metrics.csv there; give a train.py run folder")
    if not args.log.is_file():
        parser.error(f"--log {args.log}: no such file; give train.py's output")

    with open(args.run / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["test_top1"]]
    if not rows:
        parser.error(f"--run {args.run}: its metrics.csv has no evaluated epoch yet")
    config_file = args.run / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    minutes = epoch_minutes(args.log)
    if missing := [int(r["epoch"]) for r in rows if int(r["epoch"]) not in minutes]:
        parser.error(
            f"--log {args.log}: no 'INFO epoch N/E:' line for epoch(s) "
            f"{', '.join(map(str, missing))} of --run {args.run}; give that run's own log"
        )
    key = "ema_top1" if rows[-1]["ema_top1"] else "test_top1"
    epochs = [int(r["epoch"]) for r in rows]
    top1 = [100 * float(r[key]) for r in rows]
    label = run_label(config) + (" (EMA weights)" if key == "ema_top1" else "")

    fig = Figure(figsize=(10, 4), layout="constrained")
    by_time, by_epoch = fig.subplots(1, 2)
    by_time.plot([minutes[e] for e in epochs], top1, marker="o", label=label)
    by_time.set(xlabel="wall-clock minutes since launch", ylabel="test top-1 (%)")
    by_time.set_title(test_images(config))
    by_epoch.plot(epochs, top1, marker="o", label=label)
    by_epoch.plot(
        REFERENCE["epochs"],
        REFERENCE["top1"],
        marker="s",
        linestyle="none",
        label="omihub777 ViT 6.3M, V100 (published)",
    )
    by_epoch.set(xlabel="epoch", ylabel="test top-1 (%)", title="At equal epochs")
    for ax in (by_time, by_epoch):
        ax.axhline(80, color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    # the format by --out's name: the temporary file's .tmp names none
    atomic_write(args.out, lambda tmp: fig.savefig(tmp, dpi=110, format=suffix))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    _cli.run(main)
