"""What the command-line front ends share: one-line errors, checked numbers, machine defaults.

Light on purpose (argparse and os only): `train.py --help` and friends import it before
anything heavy, and print their help without loading torch.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

TTA_CHOICES = ("none", "flip", "shift", "flip-shift")  # --tta of evaluate.py and predict (vit.tta)
MODEL_DTYPES = ("float32", "bfloat16")  # --model-dtype (vit.precision does the work)
KNN_KS = (10, 20, 100, 200)  # --knn-k's default, DINO's and DINOv2's (vit.probe does the work)
TIMM_WEIGHTS = "timm"  # --pretrained with no value: timm's published weights for the model name


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit status 2) instead of the whole
    usage text: `train.py: error: --epochs 0: training epochs; accepted: an integer >= 1`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Range:
    """The accepted values of a number: low <= value <= high, either end maybe open or absent.
    Floats must also be finite."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is not accepted
    high_open: bool = False  # high itself is not accepted
    integer: bool = False

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (
            self.high is not None and (value > self.high or (self.high_open and value == self.high))
        )

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high is None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{kind} in {left}{self.low:g}, {self.high:g}{right}"


AT_LEAST_1 = Range(1, integer=True)
AT_LEAST_0 = Range(0, integer=True)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
PROBABILITY = Range(0, 1)  # a chance per image or batch: 0 never, 1 always
DROP_RATE = Range(0, 1, high_open=True)  # a fraction dropped: 1 would drop everything


def out_of_range(flag: str, value: float, accepted: Range, what: str = "") -> str:
    """'--epochs 0: training epochs; accepted: an integer >= 1'."""
    return f"{flag} {value}: {what + '; ' if what else ''}accepted: {accepted}"


def number_in(accepted: Range):
    """An argparse `type` that reads a number and refuses it outside `accepted`."""
    parse = int if accepted.integer else float

    def convert(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {str(accepted)}") from None
        if value not in accepted:
            raise argparse.ArgumentTypeError(f"{text} is outside the accepted range: {accepted}")
        return value

    convert.__name__ = parse.__name__
    return convert


def default_workers() -> int:
    """Data loader processes by default: one per spare core, at most 4 (on 2 cores: 1, which
    keeps DataLoader from warning that 4 workers exceed the machine)."""
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(0, min(4, cores - 1))


def unwritable(flag: str, path: Path, folder: bool) -> str | None:
    """Why `path` could not be written at the end of a command (None if it could), so that a
    command refuses it before any work: a folder where a file goes (or the reverse), or a
    location without write permission."""
    path = Path(path)
    if not folder and path.is_dir():
        return f"{flag} {path}: is a folder; give a file name"
    if folder and path.exists() and not path.is_dir():
        return f"{flag} {path}: exists and is not a folder"
    existing = path if folder and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {path}: cannot write there ({existing} is not a writable folder)"
    return None


# -- the model arguments of evaluate.py, predict and export ---------------------------------------
CHECKPOINT_HELP = (
    "a train.py run folder (or a weights file in it), one of our .safetensors files, a "
    "transformers folder, a weights file of another layout (with --model), or a model name "
    "(with --pretrained)"
)


def add_model_arguments(parser: argparse.ArgumentParser, positional: bool = False) -> None:
    """The model arguments every command takes, resolved by `vit.factory.resolve_model`:
    --checkpoint (or a positional CHECKPOINT), --model NAME and --pretrained [PATH]."""
    if positional:
        parser.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    else:
        parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    alone = "" if positional else "; alone: that model with timm's pretrained weights"
    parser.add_argument(
        "--model",
        metavar="NAME",
        help=f"the architecture of a weights file that does not record it (a name of "
        f"vit.list_models()){alone}",
    )
    parser.add_argument(
        "--pretrained",
        nargs="?",
        const=TIMM_WEIGHTS,
        metavar="PATH",
        help="with a model name: timm's pretrained weights, or those of the weights file PATH",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads: one setting for both runtimes (`use_threads`)."""
    parser.add_argument(
        "--threads",
        type=number_in(AT_LEAST_1),
        metavar="N",
        help="CPU threads for inference, PyTorch's (torch.set_num_threads) and onnxruntime's "
        "(intra_op_num_threads) alike (default: torch's, the machine's physical cores)",
    )


def add_model_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """--model-dtype (timm's name): the weights' dtype for inference (`vit.precision`)."""
    parser.add_argument(
        "--model-dtype",
        choices=MODEL_DTYPES,
        default="float32",
        help="the weights' dtype: bfloat16 ran 3-5x faster than float32 on a CPU with AMX (ViT-S, "
        "ViT-B, DINOv2 at 224 px) and is slower on CPUs without AVX512-BF16 (a warning says so); "
        "accuracy in docs/fast-inference.md (default: %(default)s)",
    )


def use_threads(threads: int | None) -> None:
    """--threads N for PyTorch and, read from torch when a session is made, for onnxruntime."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def missing_model_argument(args: argparse.Namespace) -> str | None:
    """The one-line complaint when neither --checkpoint nor --model names a model."""
    if args.checkpoint is None and args.model is None:
        return (
            "no model given: pass --checkpoint (a model name, a weights file or folder) or "
            "--model NAME"
        )
    return None


def pretrained_weights(value: str | None) -> bool | str:
    """A --pretrained value -> create_model's `pretrained`: no value means timm's weights."""
    if not value:
        return False
    return True if value in (TIMM_WEIGHTS, "true", "True") else value
