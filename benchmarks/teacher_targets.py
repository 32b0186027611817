"""What a distillation teacher tells its student: a run's own teacher asked about the images
the student trains on, beside the clean test images its logged top-1 is measured on.

    python benchmarks/teacher_targets.py runs/speedrun_proxy/whiten-distill-soft-seed1 \
        runs/speedrun_proxy/whiten-distill-soft-airbench-recipe-seed1 --epochs 0 50
    python benchmarks/teacher_targets.py RUN --epochs 50 --set aa_n=0   # without RandAugment

A run of `train.py --distillation-type` logs its teacher's top-1 on the test images, but the
student learns from the teacher's answers on its own training batches: pad-crop, flips,
RandAugment and erasing, then CutMix/MixUp, as the run draws them (`vit.training.distillation`).
For each run folder given (its config.yaml and teacher.safetensors), this rebuilds the run's
training batches of each epoch asked for (`--batch-augment` runs: the very images of that
epoch, shuffled and augmented from the run's seed; the mixing on the run's schedule and by its
settings, its boxes drawn afresh) and asks the frozen teacher about them under the run's
autocast, as training does. Per run and set of images: the teacher's top-1 (against the
label, or a mixed image's larger share), its cross-entropy against the targets the student is
given (label smoothing and mixing included) and the mean probability of its top class (how
sharp its targets are); the training batches both as mixed and unmixed (the same images, their
own labels). `--set KEY=VALUE` changes the run's settings for the batches (train.py's names:
aa_n=0 leaves RandAugment out), to tell which of the student's augmentations a teacher fails
on, or how it is asked (teacher_tta=flip: its answers flip-averaged, as training would take
them). Reads the run folder only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import _cli
import torch
import torch.nn.functional as F
import yaml

from vit.cli.flags import train_setting
from vit.data.mixup import one_hot
from vit.inference.precision import autocast
from vit.training.build import build_mixup, build_training_model, load_data, make_loaders
from vit.training.checkpoint import TEACHER_FILE
from vit.training.distillation import load_teacher, teacher_logits
from vit.training.settings import TrainConfig, mixup_on_for_epoch
from vit.utils.files import atomic_write_text
from vit.utils.process_group import DistInfo


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _cli.parser(__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of train.py with a teacher")
    parser.add_argument(
        "--epochs", type=int, nargs="+", default=[0], help="the epochs' batches (0: the first)"
    )
    parser.add_argument(
        "--set",
        type=train_setting,
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="the run's settings changed for the training batches (aa_n=0: no RandAugment)",
    )
    parser.add_argument("--threads", type=int, default=None, help="PyTorch's threads")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    _cli.check_json(parser, args.json)
    return args


def run_config(run: Path, changes: dict | None = None) -> TrainConfig:
    """The run's settings as it wrote them with `changes` (train.py's keys), read on the CPU,
    not resuming anything."""
    cfg = TrainConfig(**yaml.safe_load((run / "config.yaml").read_text()))
    return replace(cfg, **(changes or {}), device="cpu", resume=None, compile=False)


def answers(
    teacher: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    cfg: TrainConfig,
    num_classes: int,
) -> dict:
    """The teacher's top-1, cross-entropy against the targets and mean top probability over
    `batches` of (images (B, 3, H, W), targets): labels (B,) or soft targets (B, K)."""
    device = torch.device("cpu")
    images_seen, correct, cross_entropy, top_probability = 0, 0, 0.0, 0.0
    with torch.no_grad():
        for images, targets in batches:
            if targets.ndim == 1:  # labels: the run's smoothing, as the student's loss has it
                labels = targets
                targets = one_hot(labels, num_classes, cfg.label_smoothing)  # (B, K)
            else:
                labels = targets.argmax(dim=1)  # a mixed image's larger share
            with autocast(device, cfg.amp, cfg.amp_dtype):
                logits = teacher_logits(teacher, images, cfg.teacher_tta)  # (B, K)
            log_probs = F.log_softmax(logits, dim=1)
            # topk as evaluate() picks the class: bfloat16's logits tie at times, and argmax
            # breaks a tie otherwise (5 of 10,000 test images moved the top-1 by 0.05)
            predicted = logits.topk(1, dim=1).indices[:, 0]  # (B,)
            correct += (predicted == labels).sum().item()
            cross_entropy -= (targets * log_probs).sum().item()
            top_probability += log_probs.exp().max(dim=1).values.sum().item()
            images_seen += images.shape[0]
    return {
        "images": images_seen,
        "top1": correct / images_seen,
        "cross_entropy": cross_entropy / images_seen,
        "top_probability": top_probability / images_seen,
    }


def measure(run: Path, epochs: list[int], changes: dict) -> dict:
    """The run's teacher on its test images and on each epoch's training batches, the run's
    settings changed by `changes`."""
    cfg, info, device = run_config(run, changes), DistInfo(), torch.device("cpu")
    torch.manual_seed(cfg.seed)
    train_set, test_set = load_data(cfg, info)
    model = build_training_model(cfg, train_set.class_names)  # its preprocessing, nothing more
    train_loader, test_loader = make_loaders(
        cfg, train_set=train_set, test_set=test_set, model=model, info=info, device=device
    )
    teacher, facts = load_teacher(run / TEACHER_FILE, train_set.num_classes)
    ask = dict(cfg=cfg, num_classes=train_set.num_classes)
    row = {
        "run": str(run),
        "teacher": {
            key: facts.get(key, "none" if key == "aa" else None)  # "aa": a file of before it
            for key in ("width", "channel_mult", "stem", "recipe", "aa")
        },
        "logged_test_top1": facts["test_top1"],
        "changes": changes,
        "test": answers(teacher, test_loader, **ask),
        "epochs": {},
    }
    mixup = build_mixup(cfg, train_set.num_classes)
    for epoch in epochs:
        train_loader.set_epoch(epoch)
        batches = list(train_loader)  # (images (B, 3, H, W), labels (B,)): 10,000 are ~120 MB
        mixed = batches
        if mixup is not None:
            mixup.enabled = mixup_on_for_epoch(cfg, epoch)
            # the mixing's draws from the global generator, from a seed of this epoch's own
            torch.manual_seed(cfg.seed + epoch)
            mixed = [mixup(images, labels) for images, labels in batches]
        row["epochs"][epoch] = {
            "mixed": answers(teacher, mixed, **ask),
            "unmixed": answers(teacher, batches, **ask),
        }
    return row


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for run in args.runs:
        if not (run / TEACHER_FILE).is_file() or not (run / "config.yaml").is_file():
            sys.exit(f"teacher_targets.py: {run}: no {TEACHER_FILE} and config.yaml; give a run "
                     f"folder of train.py --distillation-type")  # fmt: skip
        try:
            rows.append(measure(run, args.epochs, dict(args.set)))
        except ValueError as e:
            sys.exit(f"teacher_targets.py: {e}")
        print(json.dumps(rows[-1]), flush=True)
        if args.json:  # after every run: a stopped measurement keeps what it measured
            atomic_write_text(args.json, json.dumps(rows, indent=2) + "\n")
    print("\n| run | teacher | images | top-1 | cross-entropy | top probability |")
    print("|---|---|---|---:|---:|---:|")
    for row in rows:
        teacher = f"{row['teacher']['stem']} stem, {row['teacher']['recipe']}"
        if row["teacher"]["aa"] != "none":
            teacher += f", trained under {row['teacher']['aa']}"
        if row["changes"]:
            teacher += ", " + " ".join(f"{key}={value}" for key, value in row["changes"].items())
        sets = [("test", row["test"])]
        for epoch, asked in row["epochs"].items():
            sets += [(f"epoch {epoch}, {kind}", asked[kind]) for kind in ("mixed", "unmixed")]
        for name, figures in sets:
            print(
                f"| {Path(row['run']).name} | {teacher} | {name} | {100 * figures['top1']:.2f} | "
                f"{figures['cross_entropy']:.3f} | {figures['top_probability']:.3f} |"
            )


if __name__ == "__main__":
    _cli.run(main)
