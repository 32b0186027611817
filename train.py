"""Train a ViT on CIFAR-10/100 or an image folder, from scratch or fine-tuned.

    python train.py --data cifar10                              # the CIFAR recipe
    python train.py --data path/to/folder --epochs 30 --batch-size 64
    python train.py --config configs/cifar10.yaml --lr 5e-4      # flags override the YAML
    python train.py --resume runs/RUN                            # continue a killed run
    torchrun --nproc_per_node 4 train.py --data cifar10          # DistributedDataParallel

Settings are layered: defaults < the resumed run's config.yaml < --config YAML < flags.
Every flag is a field of vit.train_config.TrainConfig (where its default and help live).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import types
import typing
from pathlib import Path

import yaml

# Only light modules here: `train.py --help` must not wait for torch (the engine is imported
# once the flags are read).
from vit.cli import ArgumentParser, unwritable
from vit.train_config import TrainConfig, check_settings

GROUPS = ("data", "model", "optimisation", "augmentation", "run")


def _none_or(parse):
    """A flag type that reads 'none' or 'null' as None and anything else through `parse`."""

    def convert(value: str):
        return None if value.lower() in ("none", "null", "") else parse(value)

    convert.__name__ = parse.__name__  # argparse names the type in "invalid int value"
    return convert


def _key_value(item: str) -> tuple[str, object]:
    """'depth=6' -> ('depth', 6): the value read as YAML."""
    key, sep, value = item.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--model-kwargs expects KEY=VALUE, got {item!r}")
    return key, yaml.safe_load(value)


def flag_options(f: dataclasses.Field, annotation) -> dict:
    """argparse keywords for one TrainConfig field, from its type, default and metadata."""
    meta = f.metadata
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    options = {"help": meta["help"].replace("%", "%%"), "default": default, **meta["flag"]}
    args = typing.get_args(annotation)
    optional = isinstance(annotation, types.UnionType) and type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else annotation
    if base is bool:
        options["action"] = argparse.BooleanOptionalAction
        if default is not None:
            options["help"] += f" (default {'on' if default else 'off'})"
        return options
    if base is dict:
        options["type"] = _key_value
    else:
        options["type"] = _none_or(base) if optional else base
    if default is not None and "default:" not in meta["help"] and base is not dict:
        options["help"] += f" (default {default})"
    return options


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field (`--batch-size` for batch_size), plus --config and
    --overwrite (what to do, not how to train: they are not saved with the run)."""
    parser = ArgumentParser(
        prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        groups[f.metadata["group"]].add_argument(flag, **flag_options(f, hints[f.name]))
    help = "YAML file of settings (keys: field or flag names)"
    groups["run"].add_argument("--config", type=Path, help=help)
    help = (
        "train into an --output-dir that holds a run, replacing it: the previous run's files "
        "(weights, state, metrics, eval-*/ reports) are removed once the new run starts"
    )
    groups["run"].add_argument("--overwrite", action="store_true", help=help)
    return parser


def read_yaml_config(path: Path) -> dict:
    """A YAML mapping of settings, each checked and converted as its flag would be.

    Keys are field names with - or _; unknown keys, bad values and values outside a flag's
    choices are errors that name the file. Strings go through the flag's type (YAML reads
    1e-3 as a string); a list for model_kwargs is read as KEY=VALUE items.
    """
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"train.py: error: cannot read config file {path}: {e}") from e
    if not isinstance(data, dict):
        raise SystemExit(f"train.py: error: config file {path} must hold a mapping of settings")
    hints = typing.get_type_hints(TrainConfig)
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            raise SystemExit(
                f"train.py: error: config file {path}: unknown key {raw_key!r}; known keys: "
                f"{', '.join(sorted(known))}"
            )
        options = flag_options(known[key], hints[key])
        out[key] = _convert(key, value, options, str(path))
    return out


def _convert(key: str, value, options: dict, source: str):
    if value is None:
        return None
    convert = options.get("type")
    try:
        if isinstance(value, list) and options.get("nargs") == "*":
            value = [convert(item) if isinstance(item, str) else item for item in value]
        elif isinstance(value, str) and convert is not None:
            value = convert(value)
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise SystemExit(f"train.py: error: {source}: bad value for {key}: {value!r} ({e})") from e
    choices = options.get("choices")
    if choices and value not in choices:
        raise SystemExit(
            f"train.py: error: {source}: {key} must be one of {list(choices)}, got {value!r}"
        )
    return value


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Command line -> TrainConfig: defaults < resumed run's config < --config YAML < flags."""
    return parse_command(argv)[0]


def parse_command(argv: list[str] | None = None) -> tuple[TrainConfig, bool]:
    """Command line -> (TrainConfig, --overwrite), every value checked: a bad value, a run
    folder that cannot be resumed, or one that would be trained over exits in one line, before
    anything is written."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)  # where the YAML layers come from (--help exits)
    from vit.checkpoint import CONFIG_FILE, STATE_FILE  # after --help: it imports torch

    layers = []
    if first.resume:
        run = Path(first.resume)
        if not run.is_dir():
            parser.error(f"--resume {run}: no such run folder")
        if not (run / STATE_FILE).is_file():
            again = f"--config {run / CONFIG_FILE} " if (run / CONFIG_FILE).is_file() else ""
            parser.error(
                f"--resume {run}: no checkpoint there ({STATE_FILE} is written at the end of "
                f"each epoch); start that run again with {again}--output-dir {run} --overwrite, "
                f"or resume another folder"
            )
        if first.overwrite:
            parser.error(f"--resume {run} continues that run; --overwrite would start anew")
        if first.output_dir is not None and Path(first.output_dir) != run:
            parser.error(
                f"--resume {run} continues in its own folder; leave out --output-dir "
                f"{first.output_dir}"
            )
        saved = run / CONFIG_FILE
        layers += [saved] if saved.is_file() else []  # absent if killed before writing it
    if first.config is not None:
        layers.append(first.config)
    for path in layers:  # later layers win, and flags win over all (as timm's train.py)
        parser.set_defaults(**read_yaml_config(path))
    settings = vars(parser.parse_args(argv))
    del settings["config"]
    overwrite = settings.pop("overwrite")
    settings["model_kwargs"] = dict(settings["model_kwargs"] or {})
    if first.resume:
        settings["resume"] = settings["output_dir"] = str(first.resume)
    cfg = TrainConfig(**settings)
    try:
        check_settings(cfg)
    except ValueError as e:
        parser.error(str(e))
    if cfg.cache_dir is not None:
        problem = unwritable("--cache-dir", cfg.cache_path, folder=True)
        if problem:
            parser.error(problem)
    if not cfg.resume and cfg.output_dir is not None:
        problem = output_dir_problem(Path(cfg.output_dir), overwrite)
        if problem:
            parser.error(problem)
    return cfg, overwrite


def output_dir_problem(folder: Path, overwrite: bool) -> str | None:
    """Why a new run cannot go into `folder` (None if it can): it is a file, it cannot be
    written, or it holds a run that only --overwrite may replace."""
    from vit.checkpoint import run_files

    problem = unwritable("--output-dir", folder, folder=True)
    if problem:
        return problem
    previous = run_files(folder)
    if previous and not overwrite:
        names = ", ".join(p.name for p in previous[:4]) + (", ..." if len(previous) > 4 else "")
        return (
            f"--output-dir {folder} holds a run ({names}); continue it with --resume {folder}, "
            f"train into a new folder, or pass --overwrite to replace it"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    cfg, overwrite = parse_command(argv)
    from vit import distributed
    from vit.engine import NonFiniteLossError, train
    from vit.images import CorruptImageError

    info = distributed.from_env()
    logging.basicConfig(
        level=logging.INFO if info.is_main else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    try:
        train(cfg, info, overwrite=overwrite)
    except NonFiniteLossError as e:
        print(f"train.py: stopped: {e}", file=sys.stderr)
        return 1
    except (CorruptImageError, FileNotFoundError, ValueError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    if info.is_main:
        print(
            f"train.py: wrote {cfg.output_dir}/: model.safetensors (the final weights), "
            f"best.safetensors, metrics.csv, curves.png, tensorboard/, config.yaml, "
            f"training_state.pt",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
