"""Fine-tuning a pretrained backbone, side by side on the same images and budget: the linear
probe, the head alone, every weight, every weight with layer decay, probe then fine-tune (by
AdamW, by SGD with momentum as the ViT paper did, by timm's LAMB or Lion), and the same
architecture from scratch as the floor. Each row is one train.py command (printed);
the table gives each row's top-1 on the test images after its last epoch.

    python benchmarks/finetune_table.py --backbone ../shared/data/dinov2-small \\
        --model vit_small_patch14_dinov2 --data ../shared/data/cifar10-jpg --out runs/ft-table

The linear probe is the epoch-0 line of the probe-then-fine-tune row: the head fitted by
evaluate.py --linear-probe's protocol on the frozen features of the same training images at
the same size, scored on the same test images, before any step.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import _cli

from vit.cli.flags import kept_output, number_in
from vit.utils.files import atomic_write_text
from vit.utils.ranges import AT_LEAST_0, AT_LEAST_1, NON_NEGATIVE

ROOT = Path(__file__).resolve().parents[1]
# train.py by its path in this repository, run in the user's folder: --data, --backbone and
# --out mean in its commands what they meant as typed
TRAIN = ROOT / "train.py"

# (row, its flags beyond the shared ones)
ROWS = {
    "head only (--trainable-blocks 0)": ["--trainable-blocks", "0", "--lr", "1e-3"],
    "full fine-tuning": ["--lr", "5e-5"],
    "full, layer decay 0.65": ["--lr", "2e-4", "--layer-decay", "0.65"],
    "probe, then full with layer decay 0.65": [
        "--lr",
        "2e-4",
        "--layer-decay",
        "0.65",
        "--head-init",
        "probe",
    ],  # fmt: skip
    # the ViT paper's optimizer (Dosovitskiy et al. 2021): SGD, momentum 0.9, no weight decay
    "probe, then full with SGD momentum, lr 3e-3": (
        "--opt momentum --weight-decay 0 --lr 3e-3 --head-init probe".split()
    ),
    "probe, then full with SGD momentum, layer decay 0.65, lr 1e-2": (
        "--opt momentum --weight-decay 0 --lr 1e-2 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with SGD momentum, layer decay 0.65, lr 3e-2": (
        "--opt momentum --weight-decay 0 --lr 3e-2 --layer-decay 0.65 --head-init probe".split()
    ),
    # timm's LAMB (DeiT III's optimizer) and Lion (its rates below AdamW's, its decay 0.5)
    "probe, then full with LAMB, layer decay 0.65, lr 3e-4": (
        "--opt lamb --lr 3e-4 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with LAMB, layer decay 0.65, lr 1e-3": (
        "--opt lamb --lr 1e-3 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with LAMB, layer decay 0.65, lr 3e-3": (
        "--opt lamb --lr 3e-3 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with LAMB, layer decay 0.65, lr 1e-2": (
        "--opt lamb --lr 1e-2 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with Lion, layer decay 0.65, lr 2e-5": (
        "--opt lion --weight-decay 0.5 --lr 2e-5 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with Lion, layer decay 0.65, lr 5e-5": (
        "--opt lion --weight-decay 0.5 --lr 5e-5 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with Lion, layer decay 0.65, lr 1e-4": (
        "--opt lion --weight-decay 0.5 --lr 1e-4 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with Lion, layer decay 0.65, lr 2e-4": (
        "--opt lion --weight-decay 0.5 --lr 2e-4 --layer-decay 0.65 --head-init probe".split()
    ),
    "probe, then full with Lion, layer decay 0.65, lr 4e-4": (
        "--opt lion --weight-decay 0.5 --lr 4e-4 --layer-decay 0.65 --head-init probe".split()
    ),
    "from scratch (the floor)": ["--lr", "1e-3", "--no-pretrained"],
}
PROBE_LINE = re.compile(r"epoch 0/\d+ \(--head-init probe.*?top-1 ([\d.]+)%")


def row_folder(args: argparse.Namespace, name: str) -> Path:
    """The folder of a row's run under --out, named after the row."""
    return args.out / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shared_flags(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        "--data", args.data, "--model", args.model, "--img-size", str(args.img_size),
        "--train-subset", str(args.train_images), "--test-subset", str(args.test_images),
        "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
        "--warmup-epochs", str(args.warmup_epochs), "--opt", "adamw", "--weight-decay", "0.05",
        "--crop", "rrc", "--rrc-scale", "0.35", "--label-smoothing", "0.1",
        "--workers", str(args.workers), "--device", args.device,
        "--output-dir", str(out), "--seed", str(args.seed),
        # train.py replaces a run only where the table's own --overwrite said so (main checks)
        *(["--overwrite"] if args.overwrite else []),
        *(["--threads", str(args.threads)] if args.device == "cpu" else ["--amp"]),
        *(["--model-kwargs", *args.model_kwargs] if args.model_kwargs else []),
    ]  # fmt: skip


def run_row(name: str, flags: list[str], args: argparse.Namespace) -> dict:
    out = row_folder(args, name)
    pretrained = [] if "--no-pretrained" in flags else ["--pretrained", args.backbone]
    flags = [f for f in flags if f != "--no-pretrained"]
    command = [sys.executable, str(TRAIN), *shared_flags(args, out), *pretrained, *flags]
    print("$", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    atomic_write_text(args.out / f"{out.name}.log", done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{name}: train.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    probe = PROBE_LINE.search(done.stderr + done.stdout)
    return {
        "row": name,
        "top1": float(rows[-1]["test_top1"]),
        "ema_top1": float(rows[-1]["ema_top1"]) if rows[-1]["ema_top1"] else None,
        "probe_top1": float(probe.group(1)) / 100 if probe else None,
        "minutes": seconds / 60,
        "flags": " ".join(pretrained + flags),
    }


def main() -> None:
    parser = _cli.parser(__doc__)
    count = number_in(AT_LEAST_1)  # 0 images, epochs or threads: a failed train.py, not a row
    parser.add_argument("--backbone", required=True, help="the pretrained weights (--pretrained)")
    parser.add_argument("--model", required=True, help="its architecture's name")
    parser.add_argument("--data", required=True)
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="a folder for the rows' runs, one folder each, named after the row",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the runs of earlier rows under --out"
    )
    parser.add_argument("--img-size", type=count, default=112)
    parser.add_argument("--train-images", type=count, default=1000)
    parser.add_argument("--test-images", type=count, default=2000)
    parser.add_argument("--epochs", type=count, default=3)
    parser.add_argument("--warmup-epochs", type=number_in(NON_NEGATIVE), default=0.5)
    parser.add_argument("--batch-size", type=count, default=32)
    parser.add_argument("--threads", type=count, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (then with --amp)")
    parser.add_argument("--workers", type=number_in(AT_LEAST_0), default=0, help="loader processes")
    parser.add_argument("--model-kwargs", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = parser.parse_args()
    _cli.check_json(parser, args.json)
    for name in args.rows:  # before any row: a run the user kept there is not replaced unasked
        if problem := kept_output("--out", row_folder(args, name), args.overwrite):
            parser.error(problem)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_row(name, ROWS[name], args) for name in args.rows]
    if args.json:
        settings = {
            k: str(v) for k, v in vars(args).items() if k not in ("json", "rows", "overwrite")
        }
        atomic_write_text(args.json, json.dumps({"settings": settings, "rows": results}, indent=1))
    print(
        f"\n{args.model} from {args.backbone} at {args.img_size} px: {args.train_images} training "
        f"images, {args.test_images} test images (both stratified, seed {args.seed}), "
        f"{args.epochs} epochs, batch {args.batch_size}, AdamW but where a row's --opt says "
        f"otherwise, device {args.device}\n"
    )
    print("| row | test top-1 | EMA top-1 | minutes | flags |\n|---|---:|---:|---:|---|")
    for r in results:
        if r["probe_top1"] is not None:
            print(
                f"| linear probe (epoch 0 of the next row) | {100 * r['probe_top1']:.2f}% | | | |"
            )
        ema = f"{100 * r['ema_top1']:.2f}%" if r["ema_top1"] is not None else ""
        print(
            f"| {r['row']} | {100 * r['top1']:.2f}% | {ema} | {r['minutes']:.1f} | `{r['flags']}` |"
        )


if __name__ == "__main__":
    _cli.run(main)
