"""Train a ViT on CIFAR-10/100 or an image folder, from scratch or fine-tuned.

    python -m vit.train --data cifar10                          # the CIFAR recipe
    python -m vit.train --data path/to/folder --epochs 30 --batch-size 64
    python -m vit.train --config configs/cifar10.yaml --lr 5e-4  # a checkout's recipe; flags win
    python -m vit.train --data cifar10 --time-budget 1500        # as many epochs as fit in 25 min
    python -m vit.train --resume runs/RUN                        # continue a run as started
    torchrun --nproc_per_node 4 -m vit.train --data cifar10      # DistributedDataParallel
    python -m vit.distributed --standalone --nproc_per_node 2 -m vit.train --data cifar10
                                     # the same torchrun, without its report of a failed process

`vit-train` once the package is installed; `python train.py` in a checkout (and
scripts/train.sh, which picks the machine's recipe).

Settings are layered: defaults < --config YAML < flags. --resume RUN continues the run with
its own settings (its config.yaml) and number of processes: a setting given again must be the
run's, except --epochs, to extend it, and those that change how it runs, not what it learns
(vit.training.settings.CHANGEABLE_ON_RESUME). Every flag but --config and --overwrite is a
field of vit.training.settings.TrainConfig (where its default and help live).

A mistake is one line on stderr and exit status 2, under torchrun too (rank 0 says it, the
other processes leave quietly); Ctrl-C is one line naming the last checkpoint and the command
that continues the run, exit status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import logging
import os
import re
import shlex
import sys
import time
import types
import typing
from pathlib import Path

import yaml

# Only light modules here: `--help` must not wait for torch (the engine is imported once the
# flags are read).
from vit.cli.flags import (
    ArgumentParser,
    command_name,
    disk_full,
    key_value,
    signal_words,
    unwritable,
)
from vit.training.settings import (
    CHANGEABLE_ON_RESUME,
    TrainConfig,
    check_settings,
    flag_name,
    idle_settings,
)
from vit.utils import locks

if typing.TYPE_CHECKING:
    from vit.training.errors import TrainingInterrupted

GROUPS = ("data", "model", "fine-tuning", "optimisation", "augmentation", "distillation", "run")
# The command as the user ran it, which its usage line and every message it prints start with:
# `python -m vit.train`, `vit-train`, or train.py (the repository's file; also under torchrun,
# and for main() called from Python, as the messages have always said).
PROG = command_name(__name__, "vit.train", script="train.py")
NOTHING_WRITTEN = PROG + ": {how} before training started; nothing was written"


def _none_or(parse):
    """A flag type that reads 'none' or 'null' as None and anything else through `parse`."""

    def convert(value: str):
        return None if value.lower() in ("none", "null", "") else parse(value)

    convert.__name__ = parse.__name__  # argparse names the type in "invalid int value"
    return convert


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
        options["type"] = key_value
    elif typing.get_origin(base) is list:  # nargs from the field's metadata: its items' type
        options["type"] = typing.get_args(base)[0]
    else:
        options["type"] = _none_or(base) if optional else base
    if default is not None and "default:" not in meta["help"] and base is not dict:
        options["help"] += f" (default {default})"
    if f.name in HOME_EXPANDED:
        options["type"] = home_expanded(options["type"])
    return options


def home_expanded(convert):
    """`convert` of a path with `~` expanded: the shell leaves `--output-dir=~/runs` as it is,
    and a folder named "~" would be made."""
    return lambda value: convert(os.path.expanduser(value))


def shell_path(path: str | Path) -> str:
    """A path as a command line takes it: quoted, and "./-run" for "-run", which a flag would
    take for another flag."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


# timm's and torchvision's train.py names of settings this one has under another name: said where
# one is given (a flag, a config file's key)
OTHER_NAMES = {
    "smoothing": "label_smoothing",
    "data_dir": "data",
    "data_path": "data",
    "output": "output_dir (the run's own folder, not a parent of runs)",
    "experiment": "output_dir",
    "torchcompile": "compile",
    "initial_checkpoint": "pretrained",
    "input_size": "img_size",
    "mixup_alpha": "mixup",
    "cutmix_alpha": "cutmix",
    "lr_warmup_epochs": "warmup_epochs",
    "lr_min": "min_lr",
    "clip_grad_norm": "clip_grad",
    "auto_augment": "aa",
    "random_erase": "reprob",
    "ra_reps": "aug_repeats",
    "wd": "weight_decay",
}


def other_flag_names() -> dict[str, str]:
    """OTHER_NAMES as flags: '--smoothing' -> '--label-smoothing'."""
    return {
        f"--{theirs.replace('_', '-')}": "--" + ours.replace("_", "-")
        for theirs, ours in OTHER_NAMES.items()
    }


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field (`--batch-size` for batch_size), plus --config and
    --overwrite (what to do, not how to train: they are not saved with the run)."""
    parser = ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        other_names=other_flag_names(),
    )
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        groups[f.metadata["group"]].add_argument(flag, **flag_options(f, hints[f.name]))
    help = "YAML file of settings (keys: field or flag names)"
    groups["run"].add_argument("--config", type=home_expanded(Path), help=help)
    help = (
        "train into an --output-dir that holds a run, replacing it: the previous run's files "
        "(weights, state, metrics, eval-*/ reports) are removed once the new run starts"
    )
    groups["run"].add_argument("--overwrite", action="store_true", help=help)
    return parser


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    silently: `lr: 0.01` then `lr: 0.02` trained at 0.02 without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Settings that name files and folders: a YAML file's ~ is the user's home, as a shell's is.
# Not cache_dir's, which cache_path expands where it is used: config.yaml keeps it as given (the
# default ~/.cache/vit too), so that a resumed run, which reads that file, writes it unchanged.
YAML_PATHS = ("data", "data_root", "pretrained", "teacher_path", "output_dir")
# The paths whose ~ a flag's value expands: a YAML file's, and --resume's
HOME_EXPANDED = (*YAML_PATHS, "resume")


def read_yaml_config(path: Path, run_folder: bool = False) -> dict:
    """A YAML mapping of settings, each checked and converted as its flag would be.

    Keys are field names with - or _; unknown keys, a key given twice, bad values and values
    outside a flag's choices are errors that name the file. Every value goes through the flag's
    type as the flag's text would (YAML reads 1e-3 as a string, and 1.5 for an integer setting
    must not train 2 epochs); on/off settings take true or false; null only where the flag
    takes none; model_kwargs a mapping, KEY=VALUE items or one string of them; ~ in a path is
    the home folder. `run_folder`: a run's own config.yaml, read by --resume; any other file
    may not name a run to resume (it would skip --resume's checks).
    """
    try:
        data = yaml.load(Path(path).read_text(), Loader=UniqueKeyLoader) or {}
    except OSError as e:
        raise SystemExit(f"{PROG}: error: cannot read config file {path}: {e}") from e
    except yaml.YAMLError as e:  # PyYAML's message spans lines: its place and problem in one
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SystemExit(f"{PROG}: error: config file {path}: not YAML: {where}{problem}") from e
    if not isinstance(data, dict):
        raise SystemExit(f"{PROG}: error: config file {path} must hold a mapping of settings")
    hints = typing.get_type_hints(TrainConfig)
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            close = [OTHER_NAMES[key]] if key in OTHER_NAMES else []  # timm's name for it
            close = close or difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise SystemExit(
                f"{PROG}: error: config file {path}: unknown key {raw_key!r}; {hint}the keys "
                f"are {PROG}'s flags, with - or _ ({PROG} --help)"
            )
        if key in out:  # batch-size and batch_size: one setting
            raise SystemExit(f"{PROG}: error: config file {path}: {key} is given twice")
        if key == "resume" and value is not None and not run_folder:
            raise SystemExit(
                f"{PROG}: error: config file {path}: resume: {value}: a config file holds "
                f"settings; continue a run with --resume RUN (which checks it), and leave "
                f"resume out of the file"
            )
        options = flag_options(known[key], hints[key])
        out[key] = _convert(key, value, options, str(path), optional=_optional(hints[key]))
        if key in YAML_PATHS and isinstance(out[key], str):
            out[key] = os.path.expanduser(out[key])
    return out


TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "Path": "a path"}


def _optional(annotation) -> bool:
    return isinstance(annotation, types.UnionType) and type(None) in typing.get_args(annotation)


def _convert(key: str, value, options: dict, source: str, optional: bool):
    """One YAML value, read as its flag would read its text (one line naming the file, the
    key and the value otherwise)."""

    def refuse(accepted: str):
        shown = yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
        return SystemExit(f"{PROG}: error: {source}: {key}: {shown}; accepted: {accepted}")

    convert = options.get("type")
    wanted = TYPE_WORDS.get(getattr(convert, "__name__", ""), "a value")
    if options.get("nargs") not in (None, "?", "*"):
        wanted = f"a list of {options['nargs']} items, each {wanted}"

    if value is None:
        if optional or options.get("type") is key_value:
            return None
        raise refuse(f"{wanted} (this setting has no 'none')")
    if options.get("action") is argparse.BooleanOptionalAction:
        if not isinstance(value, bool):
            raise refuse("true or false")
        return value
    try:
        if convert is key_value:  # a mapping, or KEY=VALUE items as the flag takes them
            if isinstance(value, str):
                value = value.split()
            if isinstance(value, list):
                value = [convert(str(item)) for item in value]
            elif not isinstance(value, dict):
                raise refuse("a mapping {KEY: VALUE, ...} or KEY=VALUE items")
        elif options.get("nargs") not in (None, "?"):  # a list of a fixed number of items
            count = options["nargs"]
            if not isinstance(value, list) or (isinstance(count, int) and len(value) != count):
                raise refuse(wanted)
            value = [convert(str(item)) for item in value]
        elif isinstance(value, (list, dict, bool)):  # YAML's yes/no/on/off are booleans too
            raise refuse(wanted)
        else:
            value = convert(str(value))
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"{PROG}: error: {source}: bad value for {key}: {value!r} ({e})") from e
    except ValueError:
        raise refuse(wanted) from None
    choices = options.get("choices")
    if choices and value not in choices:
        raise SystemExit(
            f"{PROG}: error: {source}: {key} must be one of {list(choices)}, got {value!r}"
        )
    return value


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Command line -> TrainConfig: defaults < the resumed run's config < --config YAML < flags
    (with --resume, a setting given that differs from the run's is refused)."""
    return parse_command(argv)[0]


def parse_command(argv: list[str] | None = None) -> tuple[TrainConfig, bool]:
    """Command line -> (TrainConfig, --overwrite), every value checked: a bad value, a run
    folder that cannot be resumed, or one that would be trained over exits in one line, before
    anything is written."""
    parser = build_parser()
    first, unknown = parser.parse_known_args(argv)  # where the YAML layers come from (--help exits)
    if unknown:  # a flag argparse refuses is refused now, before torch is imported below
        parser.parse_args(argv)
    from vit.training.checkpoint import CONFIG_FILE, STATE_FILE  # after --help: it imports torch

    problem = folder_in_use(first)
    if problem:
        parser.error(problem)

    layers = []
    if first.resume:
        run = Path(first.resume)
        if not run.is_dir():
            parser.error(f"--resume {run}: no such run folder")
        if not (run / STATE_FILE).is_file():
            parser.error(
                f"--resume {run}: no checkpoint there (the run stopped before its first: "
                f"{STATE_FILE} is written every --checkpoint-interval epochs, each by default); "
                f"start that run again with {start_again_command(run)}, or resume another folder"
            )
        if first.overwrite:
            parser.error(f"--resume {run} continues that run; --overwrite would start anew")
        problem = unwritable("--resume", run, folder=True)  # its files are written again
        if problem:
            parser.error(problem)
        if first.output_dir is not None and Path(first.output_dir) != run:
            parser.error(
                f"--resume {run} continues in its own folder; leave out --output-dir "
                f"{first.output_dir}"
            )
        saved = run / CONFIG_FILE
        layers += [saved] if saved.is_file() else []  # absent if killed before writing it
    if first.config is not None:
        layers.append(first.config)
    set_in = {}  # the file each setting of a YAML layer comes from, the last one that sets it
    for path in layers:  # later layers win, and flags win over all (as timm's train.py)
        layer = read_yaml_config(path, run_folder=path != first.config)
        parser.set_defaults(**layer)
        set_in.update(dict.fromkeys(layer, path))
    settings = vars(parser.parse_args(argv))
    del settings["config"]
    overwrite = settings.pop("overwrite")
    settings["model_kwargs"] = dict(settings["model_kwargs"] or {})
    if first.resume:
        settings["resume"] = settings["output_dir"] = str(first.resume)
        problem = resume_problem(Path(first.resume), given_settings(argv, first.config))
        if problem:
            parser.error(problem)
    else:  # the run is resumed from any folder: what it reads must not depend on this one
        settings.update({key: absolute_path(key, settings[key]) for key in PATH_SETTINGS})
    cfg = TrainConfig(**settings)
    flags_given = set(given_settings(argv, config=None))  # on the command line, not in a file
    try:
        check_settings(cfg)
    except ValueError as e:  # it names a flag: say which file set it, where no flag did
        flag = re.match(r"--([\w-]+)", str(e))
        key = flag and flag.group(1).replace("-", "_")
        from_file = key in set_in and key not in flags_given
        parser.error(f"{e} (set in {set_in[key]})" if from_file else str(e))
    for idle in idle_settings(cfg, flags_given):
        print(f"{PROG}: warning: {idle}; as given, it changes nothing", file=sys.stderr)
    if cfg.cache_dir is not None:
        problem = unwritable("--cache-dir", cfg.cache_path, folder=True)
        if problem:  # the default's, often: a read-only home folder
            parser.error(f"{problem}; give another --cache-dir, or --cache-dir none")
    if not cfg.resume and cfg.output_dir is not None:
        problem = output_dir_problem(Path(cfg.output_dir), overwrite, data=cfg.data)
        if problem:
            parser.error(problem)
    return cfg, overwrite


PATH_SETTINGS = ("data", "data_root", "pretrained", "teacher_path")  # files and folders it reads


def absolute_path(key: str, value):
    """A setting that names a file or folder, absolute ('data/x/' -> '/home/me/data/x'); a name
    (cifar10, timm's weights) or a path that does not exist (yet) as it is, but data_root,
    where CIFAR is downloaded, always."""
    from vit.data.datasets import TORCHVISION_DATASETS
    from vit.factory.timm_weights import TIMM_WEIGHTS

    if not isinstance(value, str) or value.lower() in (*TORCHVISION_DATASETS, TIMM_WEIGHTS):
        return value
    return os.path.abspath(value) if key == "data_root" or Path(value).exists() else value


def folder_in_use(first: argparse.Namespace) -> str | None:
    """The refusal when another process writes the run folder this command names (the lock
    `vit.training.engine` holds while it trains; probed here, before any other check)."""
    for flag, folder in (("--resume", first.resume), ("--output-dir", first.output_dir)):
        busy = folder is not None and locks.holder(Path(folder), folder=True)
        if busy:
            return f"{flag} {locks.InUseError(Path(folder), *busy)}"
    return None


def given_settings(argv: list[str] | None, config: Path | None) -> dict:
    """The settings this command names itself, in --config's YAML or as flags (not defaults)."""
    unset = object()  # argparse fills in a default only where the namespace has no value
    names = TrainConfig.field_names()
    flags = build_parser().parse_args(argv, argparse.Namespace(**dict.fromkeys(names, unset)))
    given = read_yaml_config(config) if config is not None else {}
    given.update({key: getattr(flags, key) for key in names if getattr(flags, key) is not unset})
    if "model_kwargs" in given:
        given["model_kwargs"] = dict(given["model_kwargs"] or {})
    return given


def resume_problem(run: Path, given: dict) -> str | None:
    """Why `--resume run` with the settings `given` cannot continue the run as it was started
    (None if it can): a setting that differs from the run's (--epochs aside: see
    CHANGEABLE_ON_RESUME), or another number of processes than the run's."""
    from vit.training.checkpoint import CONFIG_FILE
    from vit.utils import process_group

    saved_file = run / CONFIG_FILE
    if not saved_file.is_file():  # a run killed before writing it: nothing to compare with
        return None
    saved = {**TrainConfig().to_dict(), **read_yaml_config(saved_file, run_folder=True)}
    given = {key: absolute_path(key, value) if key in PATH_SETTINGS else value
             for key, value in given.items()}  # fmt: skip
    changed = [
        f"{flag_setting(key, value)} (the run's: {setting_text(saved[key])})"
        for key, value in given.items()
        if key not in (*CHANGEABLE_ON_RESUME, "resume", "output_dir")
        and value != absolute_path(key, saved[key])  # a relative one, of a run from before
        and not (key == "data" and moved_folder(saved[key], value))
    ]
    if changed:
        free = ", ".join(map(flag_name, CHANGEABLE_ON_RESUME[1:]))
        return (
            f"--resume {run} continues the run with its own settings, but this command changes "
            f"{'; '.join(changed)}: leave them out (--epochs may change, to extend the run, and "
            f"what does not change what is learnt: {free}, and --data where its image folder "
            f"is now)"
        )
    processes, started = saved["processes"], process_group.from_env().world_size
    if processes is not None and processes != started:
        return (
            f"--resume {run}: the run trains in {processes} process(es) of "
            f"{saved['batch_size']} images ({processes * saved['batch_size']} a step), this "
            f"start has {started}; continue it with {resume_command(str(run), processes)}"
        )
    return None


def moved_folder(saved: str, given: str) -> bool:
    """Whether --data `given` may stand for a run's --data `saved` on --resume: an image folder
    for an image folder (moved, or on another machine), its classes checked once it is read
    (`vit.training.build.load_data`); CIFAR read from elsewhere is --data-root's."""
    from vit.data.datasets import TORCHVISION_DATASETS

    return not {saved.lower(), given.lower()} & set(TORCHVISION_DATASETS)


def flag_setting(key: str, value) -> str:
    """A setting as its flag would say it: '--lr 0.002', '--no-amp', '--model-kwargs depth=2'."""
    flag = flag_name(key)
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {setting_text(value)}"


def setting_text(value) -> str:
    """A setting's value as a flag takes it: 'on'/'off', KEY=VALUE items, or the value."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    return str(value)


def resume_command(run: str, processes: int) -> str:
    """The command that continues `run` in `processes` processes, through the entrance that
    started this one: scripts/train.sh (which names itself in VIT_TRAIN_COMMAND and starts as
    many processes as the run has), torchrun, or python."""
    if os.environ.get("VIT_TRAIN_COMMAND"):
        return f"{os.environ['VIT_TRAIN_COMMAND']} --resume {shell_path(run)}"
    return train_command(f"--resume {shell_path(run)}", processes)


def start_again_command(run: Path) -> str:
    """The command that starts `run`, stopped before its first checkpoint, anew from its
    config.yaml, in as many processes as it had (its flags, when it wrote no config.yaml).
    Not scripts/train.sh's: it would add its recipe's --data and --batch-size over the run's."""
    from vit.training.checkpoint import CONFIG_FILE
    from vit.utils import process_group

    again = f"--output-dir {shell_path(run)} --overwrite"
    config = run / CONFIG_FILE
    if not config.is_file():
        return f"its own flags and {again}"
    saved = read_yaml_config(config, run_folder=True)
    processes = saved.get("processes") or process_group.from_env().world_size
    return train_command(f"--config {shell_path(config)} {again}", processes)


def train_command(args: str, processes: int) -> str:
    """The training command with `args` in `processes` processes, started as this one was:
    under torchrun (or `python -m vit.distributed`, where that started this one) where there
    are several (or this start is torchrun's), else as typed:
    `python train.py` (the path given), `python -m vit.train` or `vit-train`."""
    if PROG == "train.py":  # the repository's file
        script = shlex.quote(sys.argv[0] if sys.argv[0].endswith("train.py") else "train.py")
        alone, program = f"python {script}", script
    else:  # the package's module, by -m or its console script; torchrun runs it by -m
        alone, program = PROG, "-m vit.train"
    if processes > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        launcher = os.environ.get("VIT_LAUNCHER", "torchrun")  # python -m vit.distributed's
        return f"{launcher} --standalone --nproc_per_node {processes} {program} {args}"
    return f"{alone} {args}"


def output_dir_problem(folder: Path, overwrite: bool, data: str | None = None) -> str | None:
    """Why a new run cannot go into `folder` (None if it can): it is a file, it cannot be
    written, it is inside the `data` folder, or it holds a run that only --overwrite may
    replace."""
    from vit.training.checkpoint import STATE_FILE, run_files

    problem = unwritable("--output-dir", folder, folder=True)
    if problem:
        return problem
    if data is not None and Path(data).is_dir():
        if folder.resolve().is_relative_to(Path(data).resolve()):  # curves.png in train/cat/
            return (
                f"--output-dir {folder} is inside --data {data}: the next run on that folder "
                f"would read this run's files (curves.png, tensorboard/) as its images or "
                f"classes; choose a folder outside it"
            )
    previous = run_files(folder)
    if previous and not overwrite:
        names = ", ".join(p.name for p in previous[:4]) + (", ..." if len(previous) > 4 else "")
        if not (folder / STATE_FILE).is_file():  # stopped before a checkpoint: --resume can't
            return (
                f"--output-dir {folder} holds a run's files but no checkpoint to resume "
                f"({names}; a run stopped before its first checkpoint): start anew with "
                f"--overwrite, which replaces them, or train into a new folder"
            )
        return (
            f"--output-dir {folder} holds a run ({names}); continue it with --resume "
            f"{shell_path(folder)}, "
            f"train into a new folder, or pass --overwrite to replace it"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    # Under torchrun every process reads the same flags and meets the same mistakes: rank 0
    # alone says so, the others leave quietly with the same exit status.
    speaks = os.environ.get("RANK", "0") == "0"
    try:
        with contextlib.nullcontext() if speaks else contextlib.redirect_stderr(io.StringIO()):
            try:
                cfg, overwrite = parse_command(argv)
            except SystemExit as e:
                if not isinstance(e.code, str):
                    raise
                print(e.code, file=sys.stderr)  # a config file's mistake: argparse's status
                return 2
        return run(cfg, overwrite)
    except KeyboardInterrupt:  # Ctrl-C before training was set up
        return said(speaks, NOTHING_WRITTEN.format(how="interrupted"), status=130)


def run(cfg: TrainConfig, overwrite: bool) -> int:
    """Train; one line on stderr (rank 0's) and an exit status for what stopped it."""
    from vit.training.engine import train
    from vit.training.errors import (
        START_ERRORS,
        DiskFull,
        NonFiniteLossError,
        PeerGone,
        TrainingError,
        TrainingInterrupted,
    )
    from vit.training.run_log import LogFile
    from vit.utils import process_group

    info = process_group.from_env()
    level = logging.INFO if info.is_main else logging.WARNING
    logging.basicConfig(level=level, format=LogFile.FORMAT)
    # basicConfig does nothing where logging is set up already (a notebook, pytest), and the
    # run's train.log is rank 0's INFO lines either way
    logging.getLogger("vit").setLevel(level)
    finished = False
    try:
        with process_group.stop_on_interrupt(info):
            train(cfg, info, overwrite=overwrite)
            finished = True
    except KeyboardInterrupt:
        if not finished:
            raise
        # Ctrl-C after the run's last write (stop_on_interrupt raises it on the way out where
        # Python swallowed it): the run is complete, and the shell still hears of the signal
        stopped_by = process_group.stopped_by()
        return said(info.is_main, complete_after(stopped_by, cfg), status=128 + stopped_by)
    except NonFiniteLossError as e:
        return said(info.is_main, f"{PROG}: stopped: {e}", status=1)
    except TrainingError as e:  # this process's own: it says so
        return said(True, f"{PROG}: error: {e}", status=2)
    except locks.LockError as e:  # another start took the folder since folder_in_use looked
        flag = "--resume" if cfg.resume else "--output-dir"
        return said(info.is_main, f"{PROG}: error: {flag} {e}", status=2)
    except START_ERRORS as e:  # met by every process alike: rank 0 says so
        if not info.is_main:  # its process group left standing by engine.train
            exit_without_teardown(2)
        return said(info.is_main, f"{PROG}: error: {e}", status=2)
    except PeerGone:
        left_for_peer()
    except DiskFull as e:  # rank 0's (the others' collectives break as it leaves)
        message = interrupted_message(e, info.world_size, disk_full(e.error))
        message += ", once there is room"
        return said(True, message, status=1)
    except TrainingInterrupted as e:
        stopped_by = process_group.stopped_by()
        if not info.is_main:  # its process group broken by rank 0 leaving
            exit_without_teardown(128 + stopped_by)
        if e.epoch is not None and e.epoch == e.epochs:  # held until the last epoch's files
            return said(True, complete_after(stopped_by, cfg), status=128 + stopped_by)
        message = interrupted_message(e, info.world_size, signal_words(stopped_by))
        return said(info.is_main, message, status=128 + stopped_by)  # the shell's 130 and 143
    return said(info.is_main, f"{PROG}: {wrote(cfg)}", status=0)


def complete_after(stopped_by: int, cfg: TrainConfig) -> str:
    """A Ctrl-C or SIGTERM (`stopped_by`) that came once the last epoch's files were written:
    the run is complete, and says what it wrote."""
    how = signal_words(stopped_by)
    return f"{PROG}: {how} after the last epoch, the run complete; {wrote(cfg)}"


def wrote(cfg: TrainConfig) -> str:
    """What a finished run wrote."""
    return (
        f"wrote {cfg.output_dir}/: model.safetensors (the final weights), "
        f"best.safetensors, metrics.csv, train.log, curves.png, tensorboard/, config.yaml, "
        f"training_state.pt{', teacher.safetensors' if cfg.distillation_type != 'none' else ''}"
    )


# How long a process whose collectives another process's end broke waits for torchrun to end
# it: torchrun checks its processes every 0.1 s (its --monitor-interval).
PEER_WAIT_SECONDS = 10


def left_for_peer() -> None:
    """Leave after another process's end broke this one's collectives. torchrun, which saw that
    process end, ends this one (SIGTERM) and names that one: a survivor that left first could
    be named in its place (of two that ended together, torchrun names the lower rank). Where
    none does (another launcher, another machine), one line says so."""
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(PEER_WAIT_SECONDS)
    print(
        f"{PROG}: stopped: another process of this run ended (its launcher's or its own "
        "output says why)",
        file=sys.stderr,
    )
    exit_without_teardown(1)


def exit_without_teardown(status: int) -> typing.NoReturn:
    """Leave at once with `status`, stderr flushed: no C++ teardown of a process group that
    another process's end or rank 0's has left standing, which can abort the process."""
    sys.stderr.flush()
    os._exit(status)


def said(speaks: bool, line: str, status: int) -> int:
    """Print `line` on stderr if this process speaks (rank 0); return `status`."""
    if speaks:
        print(line, file=sys.stderr)
    return status


def interrupted_message(e: TrainingInterrupted, processes: int, how: str = "interrupted") -> str:
    """After Ctrl-C, SIGTERM or a full disk (`how` it stopped): where the run stopped, and the
    command that continues it."""
    if e.run_dir is None:
        return NOTHING_WRITTEN.format(how=how)
    again = resume_command(e.run_dir, processes)
    if e.epoch is not None:
        return (
            f"{PROG}: {how}; {e.run_dir} stopped after epoch {e.epoch} of {e.epochs} "
            f"(its last checkpoint): continue it with {again}"
        )
    return (
        f"{PROG}: {how} before the run's first checkpoint: {e.run_dir} holds nothing "
        f"to resume; the same command with --overwrite starts it again"
    )


if __name__ == "__main__":
    sys.exit(main())
