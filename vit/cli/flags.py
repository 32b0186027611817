"""What the command-line front ends share: one-line flag errors, checked numbers, the model,
--threads and --model-dtype flags.

Light on purpose (argparse and os only): `train.py --help` and friends import it before
anything heavy, and print their help without loading torch.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from ..factory.timm_weights import TIMM_WEIGHTS
from ..inference.options import MODEL_DTYPES
from ..utils.ranges import AT_LEAST_1, Range
from ..utils.signals import handled


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit status 2) instead of the whole
    usage text: `train.py: error: --epochs 0: training epochs; accepted: an integer >= 1`; and
    no flag by a prefix of its name: timm's `--output DIR` (a parent of run folders) was taken
    as `--output-dir DIR`."""

    def __init__(self, *args, other_names: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        # another program's flag -> ours ("--smoothing" -> "--label-smoothing"), named when
        # it is given: "unrecognized arguments" alone leaves a timm user to search --help
        self.other_names = other_names or {}

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            given = message.split(":", 1)[1].split()
            ours = [
                f"{flag} is {self.other_names[flag]}" for flag in given if flag in self.other_names
            ]
            if ours:
                message += f" (here: {'; '.join(ours)})"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def print_help(self, file=None) -> None:
        # Under torchrun every process reads the flags: rank 0 alone prints --help (to stdout,
        # which the front ends do not silence on the other ranks as they do stderr).
        if os.environ.get("RANK", "0") == "0":
            super().print_help(file)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises its KeyboardInterrupt (`sigterm_as_ctrl_c`)."""


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM (`kill`, a scheduler's end of a job) stops a command as Ctrl-C
    does: its `except KeyboardInterrupt` says what was kept, and the temporary file being
    written is removed (the default end left it beside the outputs). `interrupt_status` gives
    the shell's status. Left alone off the main thread, where no handler can be set, and
    under torchrun, whose own way to end the other processes SIGTERM is."""
    if threading.current_thread() is not threading.main_thread() or "RANK" in os.environ:
        yield
        return

    def stop(signum: int, frame) -> None:
        raise Terminated

    with handled((signal.SIGTERM,), stop):
        yield


def disk_full(error: OSError) -> str | None:
    """How a command stopped by `error` says it, where the disk is full (None for any other
    OSError, which stays the traceback it is): 'stopped: No space left on device: FILE'."""
    if error.errno != errno.ENOSPC:
        return None
    return f"stopped: {error.strerror}: {error.filename}" if error.filename else f"stopped: {error}"


def signal_words(stopped_by: signal.Signals) -> str:
    """How a command stopped by a signal says it: 'interrupted' (Ctrl-C) or 'stopped by
    SIGTERM'; its exit status is the shell's, 128 + the signal (130, 143)."""
    return "interrupted" if stopped_by == signal.SIGINT else f"stopped by {stopped_by.name}"


def stopped_signal(error: KeyboardInterrupt) -> signal.Signals:
    """The signal behind `error`: SIGTERM (`sigterm_as_ctrl_c`) or Ctrl-C's SIGINT."""
    return signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT


def stopped_how(error: KeyboardInterrupt) -> str:
    return signal_words(stopped_signal(error))


def interrupt_status(error: KeyboardInterrupt) -> int:
    return 128 + stopped_signal(error)


def command_name(name: str, module: str, script: str | None = None) -> str:
    """How the user ran the command `module` ('vit.train'; `name` is its `__name__`), for its
    usage line and messages: `python -m vit.train` run as the main module, `vit-train` by its
    console script, else `script`, the repository's file (train.py, which torchrun and main()
    called from Python run too), or `python -m vit.train` for a command without one."""
    if name == "__main__":
        return f"python -m {module}"
    if runs_as_command(name, module):
        return console_script(module)
    return script or f"python -m {module}"


def console_script(module: str) -> str:
    """The console script ([project.scripts]) of the command `module`: vit.train -> vit-train."""
    return module.replace(".", "-")


def runs_as_command(name: str, module: str) -> bool:
    """Whether the command `module` (`name` is its `__name__`) is what this process runs: by
    `python -m` (then its name is __main__) or by its console script (the program's name, less
    the suffix pip's wrapper strips on Windows). Such a command reads its flags before its
    heavy imports, so that --help and a mistyped flag are answered at once: a console script
    imports the module before calling its main(), and never runs `if __name__ == "__main__"`."""
    program = re.sub(r"(-script\.pyw|\.exe)?$", "", Path(sys.argv[0]).name)
    return name == "__main__" or program == console_script(module)


def module_parser(prog: str, doc: str) -> ArgumentParser:
    """The parser (a bad flag: one line, not the usage text) of a `python -m vit.X` command
    whose module docstring is its help: the first paragraph the description, the usage paragraph
    skipped (argparse writes its own), the paragraphs after it the epilog, as written."""
    return ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def key_value(item: str) -> tuple[str, object]:
    """'depth=6' -> ('depth', 6): an argparse type for KEY=VALUE items (--model-kwargs), the
    value read as a Python literal, as timm's train.py reads it (1e-5, None, True, 'avg'), else
    as YAML (null, true, avg; YAML alone read 1e-5 as a string); an empty one as the empty
    string (a shell passes `global_pool=''` on as `global_pool=`); argparse names the flag in
    its error."""
    import ast

    import yaml  # here, not at the top: `import vit` and --help stay light

    key, sep, value = item.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
    if not value:
        return key, ""
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return key, yaml.safe_load(value)


def train_setting(item: str) -> tuple[str, object]:
    """'aa_n=0' -> ('aa_n', 0): key_value for a train.py setting (the benchmarks' --set), a key
    that is none refused at parsing."""
    from ..training.settings import TrainConfig  # here: the settings import torch

    key, value = key_value(item)
    if key not in TrainConfig.field_names():
        raise argparse.ArgumentTypeError(f"{key!r} is no train.py setting (see train.py --help)")
    return key, value


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


def kept_output(flag: str, path: Path, overwrite: bool) -> str | None:
    """Why `path` is not written: it holds something a user saved (a file, or a folder with
    anything in it) and --overwrite was not given; None if it may be written."""
    path = Path(path)
    if overwrite or not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return None
    what = "folder" if path.is_dir() else "file"
    return f"{flag} {path}: exists; add --overwrite to replace it, or choose another {what}"


def replaced_input(flag: str, path: Path, inputs: list[Path]) -> str | None:
    """Why `path` is never written, --overwrite or not: it is one of the command's `inputs` or,
    as a folder that is replaced whole, holds one; None otherwise."""
    target = Path(path).resolve()
    for source in inputs:
        source = Path(source).resolve()
        if source == target or target in source.parents:
            return f"{flag} {path}: would replace the input {source}; choose another path"
    return None


# -- the model arguments of evaluate, predict and export ---------------------------------------
CHECKPOINT_HELP = (
    "a vit.train run folder (or a weights file in it), one of our .safetensors files, a "
    "transformers folder, a weights file of another layout (with --model), or a model name "
    "(with --pretrained)"
)


def add_model_arguments(parser: argparse.ArgumentParser, positional: bool = False) -> None:
    """The model arguments every command takes, resolved by `vit.resolve_model`:
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


DATA_ROOT = "data"  # --data-root's default, relative to where the command runs


def add_data_root_argument(parser: argparse.ArgumentParser, data_flag: str = "--data") -> None:
    """--data-root: where `data_flag` cifar10/cifar100 is read, and downloaded when it is not
    there (`vit.data.datasets.load_split`); `vit.evaluate`'s, `vit.benchmark`'s and `vit.export`'s
    (its --calibration)."""
    parser.add_argument(
        "--data-root",
        default=DATA_ROOT,
        metavar="DIR",
        help=f"where {data_flag} cifar10/cifar100 is read, downloaded there when missing "
        "(default: %(default)s)",
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
    """--model-dtype (timm's name): the weights' dtype for inference (`vit.inference.precision`)."""
    parser.add_argument(
        "--model-dtype",
        choices=MODEL_DTYPES,
        default="float32",
        help="the weights' dtype: bfloat16 ran 3-5x faster than float32 on a CPU with AMX (ViT-S, "
        "ViT-B, DINOv2 at 224 px) and is slower on CPUs without AVX512-BF16 (a warning says so); "
        "accuracy in docs/fast-inference.md (default: %(default)s)",
    )


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    """--runtime: what runs an exported ONNX file (`vit.interop.onnx_runtime`)."""
    parser.add_argument(
        "--runtime",
        choices=("onnxruntime", "openvino"),
        default="onnxruntime",
        help="what runs an ONNX --checkpoint: onnxruntime, or OpenVINO (pip install "
        "'vit-from-scratch[openvino]'; "
        "with --model-dtype bfloat16 it computes in bfloat16); which is fastest on this CPU: "
        "python -m vit.benchmark (default: %(default)s)",
    )


def runtime_problem(args: argparse.Namespace) -> str | None:
    """The one-line complaint when --runtime names another runtime than onnxruntime for a
    model that is not an ONNX file (a runtime runs exported files only)."""
    checkpoint = str(args.checkpoint or "")
    if args.runtime == "onnxruntime" or checkpoint.lower().endswith(".onnx"):
        return None
    return (
        f"--runtime {args.runtime} runs an exported ONNX file, and --checkpoint is not one: "
        f"export it with python -m vit.export SRC --onnx FILE, or leave --runtime out"
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
