"""What the benchmarks' command lines share: the parser (its help the docstring's first
paragraph, a bad flag one line), the line naming the machine that measured the figures, the
checks that refuse a bad input in one line naming it and what is accepted (exit status 2)
before any work, and Ctrl-C as one line (exit status 130), not a traceback."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from vit.cli.flags import ArgumentParser, unwritable
from vit.cli.model_argument import ModelArgumentError, command_arguments, resolve_model
from vit.data.datasets import TORCHVISION_DATASETS, find_split_dir
from vit.inference.cpu_paths import cpu_flags, cpu_name
from vit.models.vision_transformer import VisionTransformer
from vit.training.settings import TrainConfig
from vit.utils.process_group import DistInfo, resolve_device

ROOT = Path(__file__).resolve().parents[1]
# the recipe a benchmark of the GPU speedrun measures by default, found from any folder
SPEEDRUN_CONFIG = ROOT / "configs" / "cifar10_gpu_speedrun.yaml"
CONFIG_HELP = (
    f"a YAML file of train.py's settings (default: this repository's "
    f"{SPEEDRUN_CONFIG.relative_to(ROOT)})"
)


def parser(doc: str) -> ArgumentParser:
    """A benchmark's parser, `doc` its module docstring: the first paragraph is the help's
    description; a bad flag is one line on stderr and exit status 2."""
    return ArgumentParser(description=doc.split("\n\n")[0])


def machine(device: str | torch.device = "cpu") -> str:
    """The machine, for a benchmark's header: the CPU's name and the instruction sets that
    decide its speed, and the GPU's name where `device` is one."""
    line = f"CPU {cpu_name()}, flags {cpu_flags()}"
    if torch.device(device).type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)}; {line}"
    return line


def run(main: Callable[[], object]) -> None:
    """Run a benchmark's main as its command: Ctrl-C ends it with one line and exit status
    130, as train.py's, not a traceback from wherever it was."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
        sys.exit(130)


def check_data(parser: ArgumentParser, data: str, names: bool = True, flag: str = "--data") -> None:
    """Refuse --data (or `flag`) in one line unless it is a folder with train/ and test/ (or
    val/) class folders or (`names`) one of the data sets load_split downloads."""
    accepted = "a folder with train/ and test/ (or val/) class folders"
    if names:
        if data.lower() in TORCHVISION_DATASETS:
            return
        accepted = f"{', '.join(TORCHVISION_DATASETS)} or {accepted}"
    if not Path(data).is_dir():
        parser.error(f"{flag} {data}: no such folder; accepted: {accepted}")
    for split in ("train", "test"):
        try:
            find_split_dir(Path(data), split)
        except FileNotFoundError as e:
            parser.error(f"{flag} {e}")


def check_json(parser: ArgumentParser, path: Path | None) -> None:
    """Refuse --json in one line where it could not be written (a folder, a place without write
    permission): checked before the work, whose figures would be lost after it. A missing
    folder is made when the file is written (atomic_write)."""
    if path is not None and (problem := unwritable("--json", path, folder=False)):
        parser.error(problem)


def check_names(parser: ArgumentParser, flag: str, names: list[str], known: Collection[str]):
    """Refuse in one line the first of `names` that is not in `known`, naming the closest
    known ones."""
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else "see vit.list_models()"
            parser.error(f"{flag} {name}: not a model name this benchmark runs; {hint}")


def checked_device(parser: ArgumentParser, name: str) -> torch.device:
    """`resolve_device` of --device, a device this machine lacks refused in one line."""
    try:
        return resolve_device(name, DistInfo())
    except ValueError as e:
        parser.error(str(e))


def checked_model(parser: ArgumentParser, flag: str, source: str | Path) -> VisionTransformer:
    """The model a weights argument names (`resolve_model`: our .safetensors, a run folder, a
    transformers folder), a missing or unreadable one refused in one line naming `flag`."""
    try:
        return resolve_model(source, names=command_arguments(flag))
    except ModelArgumentError as e:
        parser.error(str(e))


def checked_config(parser: ArgumentParser, path: Path) -> TrainConfig:
    """The TrainConfig of a YAML file of train.py's settings, read as `train.py --config` reads
    it (its `read_yaml_config`: the same checks, the same words); a missing or unreadable file,
    one that is not YAML or a key that is no setting refused in one line."""
    from vit.train import read_yaml_config  # the command's module: imported where needed

    try:
        settings = read_yaml_config(path)
    except SystemExit as e:  # train.py's one line: said again as this benchmark's
        parser.error(str(e.code).split(": error: ", 1)[-1])
    if "model_kwargs" in settings:  # a mapping or KEY=VALUE items, as train.py takes them
        settings["model_kwargs"] = dict(settings["model_kwargs"] or {})
    return TrainConfig(**settings)
