"""Train a ViT on CIFAR-10/100 or an image folder, from scratch or fine-tuned.

    python train.py --data cifar10                              # the CIFAR recipe
    python train.py --data path/to/folder --epochs 30 --batch-size 64
    python train.py --config configs/cifar10.yaml --lr 5e-4      # flags override the YAML
    python train.py --resume runs/RUN                            # continue a killed run
    torchrun --nproc_per_node 4 train.py --data cifar10          # DistributedDataParallel

Settings are layered: defaults < the resumed run's config.yaml < --config YAML < flags.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from vit import distributed
from vit.data import CorruptImageError
from vit.engine import CONFIG_FILE, NonFiniteLossError, TrainConfig, train

D = TrainConfig()  # the defaults shown in --help


def _int_or_none(value: str) -> int | None:
    return None if value.lower() in ("none", "null", "0") else int(value)


def _str_or_none(value: str) -> str | None:
    return None if value.lower() in ("none", "null", "") else value


def _float_or_none(value: str) -> float | None:
    return None if value.lower() in ("none", "null") or float(value) == 0 else float(value)


def build_parser() -> argparse.ArgumentParser:
    """Flags named as in timm's and torchvision's reference scripts; dest = TrainConfig field."""
    # argument_default=SUPPRESS: only flags typed on the command line appear in the
    # namespace, which is how they override the YAML config and the defaults.
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    bool_flag = argparse.BooleanOptionalAction
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        help=f"cifar10, cifar100, or a folder with train/ and test/ (or "
        f"val/) subfolders of class folders (default {D.data})",
    )
    g.add_argument("--data-root", help=f"where CIFAR is downloaded (default {D.data_root})")
    g.add_argument("--download", action=bool_flag, help="download CIFAR if missing (default on)")
    g.add_argument(
        "--train-subset",
        type=_int_or_none,
        metavar="N",
        help="train on N images, stratified by class (quick runs)",
    )
    g.add_argument(
        "--test-subset",
        type=_int_or_none,
        metavar="N",
        help="evaluate on N test images, stratified by class",
    )
    g.add_argument(
        "--cache",
        action=bool_flag,
        help="decode images once into memory (default: images <= 64 px only)",
    )
    g.add_argument("--workers", type=int, help=f"data loader processes (default {D.workers})")
    g.add_argument(
        "--batch-augment",
        action=bool_flag,
        help="augment whole uint8 batches held in memory (pad-crop, flip, erasing; no "
        "RandAugment): fast on CPUs (default off)",
    )
    g.add_argument(
        "--cache-dir",
        type=_str_or_none,
        help=f"keep decoded images here between runs, none for off (default {D.cache_dir})",
    )

    g = p.add_argument_group("model")
    g.add_argument("--model", help=f"a name from vit.list_models() (default {D.model})")
    g.add_argument(
        "--pretrained",
        nargs="?",
        const="timm",
        metavar="PATH",
        help="fine-tune from weights: a file, or no value for timm's default weights",
    )
    g.add_argument("--img-size", type=_int_or_none, help="model input size (pos_embed resampled)")
    g.add_argument(
        "--model-kwargs",
        nargs="*",
        metavar="KEY=VALUE",
        help="other ViTConfig fields, e.g. depth=6 embed_dim=128 num_heads=4",
    )
    g.add_argument("--drop-path", type=float, help=f"stochastic depth rate (default {D.drop_path})")
    g.add_argument("--drop", type=float, help=f"dropout before the head (default {D.drop})")
    g.add_argument(
        "--patch-drop",
        type=float,
        help=f"fraction of patch tokens dropped at random in training (default {D.patch_drop})",
    )

    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, help=f"default {D.epochs}")
    g.add_argument("--batch-size", type=int, help=f"per process (default {D.batch_size})")
    g.add_argument("--lr", type=float, help=f"peak AdamW learning rate (default {D.lr})")
    g.add_argument("--min-lr", type=float, help=f"cosine floor (default {D.min_lr})")
    g.add_argument("--weight-decay", type=float, help=f"default {D.weight_decay}")
    g.add_argument("--warmup-epochs", type=float, help="linear warmup (default: 5%% of --epochs)")
    g.add_argument(
        "--progressive-size",
        type=_int_or_none,
        help="train the first epochs at this image size, growing linearly to --img-size "
        "(needs --batch-augment; default off)",
    )
    g.add_argument(
        "--progressive-epochs",
        type=float,
        help="epochs over which the image size grows (default: half of --epochs)",
    )
    g.add_argument(
        "--clip-grad",
        type=_float_or_none,
        help=f"max gradient norm, 0 for none (default {D.clip_grad})",
    )
    g.add_argument("--label-smoothing", type=float, help=f"default {D.label_smoothing}")
    g.add_argument("--model-ema", action=bool_flag, help="keep an EMA of the weights (default on)")
    g.add_argument(
        "--model-ema-decay",
        type=float,
        help="default: averages over the last ~2%% of the optimizer steps",
    )
    g.add_argument("--amp", action=bool_flag, help="mixed precision (default off)")
    g.add_argument("--amp-dtype", choices=("bfloat16", "float16"), help=f"default {D.amp_dtype}")
    g.add_argument("--compile", action=bool_flag, help="torch.compile the model (default off)")

    g = p.add_argument_group("augmentation")
    g.add_argument(
        "--crop",
        choices=("auto", "pad", "rrc"),
        help="pad+random crop, random resized crop, or auto (pad for <= 64 px)",
    )
    g.add_argument("--rrc-scale", type=float, help=f"smallest crop area (default {D.rrc_scale})")
    g.add_argument("--hflip", type=float, help=f"horizontal flip probability (default {D.hflip})")
    g.add_argument("--aa", choices=("none", "randaug"), help=f"RandAugment policy (default {D.aa})")
    g.add_argument("--aa-n", type=int, help=f"RandAugment ops per image (default {D.aa_n})")
    g.add_argument("--reprob", type=float, help=f"random erasing probability (default {D.reprob})")
    g.add_argument("--mixup", type=float, help=f"MixUp alpha, 0 for off (default {D.mixup})")
    g.add_argument("--cutmix", type=float, help=f"CutMix alpha, 0 for off (default {D.cutmix})")
    g.add_argument("--mixup-prob", type=float, help=f"default {D.mixup_prob}")
    g.add_argument("--mixup-switch-prob", type=float, help=f"default {D.mixup_switch_prob}")

    g = p.add_argument_group("run")
    g.add_argument("--config", type=Path, help="YAML file of settings (keys: flag names)")
    g.add_argument("--seed", type=int, help=f"default {D.seed}")
    g.add_argument(
        "--threads", type=int, help="PyTorch threads per process (default: torch's own choice)"
    )
    g.add_argument(
        "--eval-interval",
        type=int,
        help=f"evaluate every N epochs and after the last (default {D.eval_interval})",
    )
    g.add_argument("--device", help="auto, cpu, cuda, cuda:1, ... (default auto)")
    g.add_argument("--output-dir", help="run folder (default runs/MODEL-DATA-TIMESTAMP)")
    g.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its last complete checkpoint",
    )
    return p


def _convert(parser: argparse.ArgumentParser, key: str, value, source: str):
    """A YAML value through the flag's own type (YAML reads 1e-3 as a string)."""
    action = next(a for a in parser._actions if a.dest == key)
    if key == "model_kwargs" and isinstance(value, list):
        return _parse_kwargs(value)
    if isinstance(value, str) and action.type is not None:
        try:
            value = action.type(value)
        except ValueError as e:
            raise SystemExit(
                f"train.py: error: {source}: bad value for {key}: {value!r} ({e})"
            ) from e
    if action.choices and value not in action.choices:
        raise SystemExit(
            f"train.py: error: {source}: {key} must be one of {list(action.choices)}, got {value!r}"
        )
    return value


def _parse_kwargs(items: list[str]) -> dict:
    """['depth=6', 'embed_dim=128'] -> {'depth': 6, 'embed_dim': 128} (values read as YAML)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"train.py: error: --model-kwargs expects KEY=VALUE, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def read_yaml_config(path: Path, parser: argparse.ArgumentParser) -> dict:
    """A YAML mapping of settings; keys are flag names with - or _; unknown keys are errors."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"train.py: error: cannot read config file {path}: {e}") from e
    if not isinstance(data, dict):
        raise SystemExit(f"train.py: error: config file {path} must hold a mapping of settings")
    known = set(TrainConfig.field_names())
    out = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            raise SystemExit(
                f"train.py: error: config file {path}: unknown key {raw_key!r}; known keys: "
                f"{', '.join(sorted(known))}"
            )
        out[key] = value if value is None else _convert(parser, key, value, str(path))
    return out


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Command line -> TrainConfig: defaults < resumed run's config < --config YAML < flags."""
    parser = build_parser()
    flags = vars(parser.parse_args(argv))
    settings: dict = {}
    resume = flags.get("resume")
    if resume:
        saved = Path(resume) / CONFIG_FILE
        if not Path(resume).is_dir():
            parser.error(f"--resume {resume}: no such run folder")
        if saved.is_file():
            settings.update(read_yaml_config(saved, parser))
    config_file = flags.pop("config", None)
    if config_file is not None:
        settings.update(read_yaml_config(config_file, parser))
    if "model_kwargs" in flags:
        flags["model_kwargs"] = _parse_kwargs(flags["model_kwargs"] or [])
    settings.update(flags)
    if resume:
        settings["resume"] = settings["output_dir"] = str(resume)
    return TrainConfig(**settings)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    info = distributed.from_env()
    logging.basicConfig(
        level=logging.INFO if info.is_main else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    try:
        train(cfg, info)
    except NonFiniteLossError as e:
        print(f"train.py: stopped: {e}", file=sys.stderr)
        return 1
    except (CorruptImageError, FileNotFoundError, ValueError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
