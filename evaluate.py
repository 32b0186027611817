"""Evaluate a trained ViT: top-1, top-5, per-class accuracy, a confusion matrix PNG, a JSON report.

    python evaluate.py --checkpoint runs/RUN --data cifar10
    python evaluate.py --checkpoint runs/RUN/best.safetensors --data path/to/folder --json r.json
    python evaluate.py --checkpoint vit_base_patch16_224 --pretrained --data path/to/imagenet
    python evaluate.py --checkpoint path/to/hf-folder --data path/to/imagenet
    python evaluate.py --checkpoint timm_weights.pth --model vit_small_patch16_224 --data ...

The model argument is read as by `python -m vit.predict` and `vit.export`: a run folder (its
model.safetensors) or a weights file in it, our .safetensors, a transformers folder, a weights
file of another layout with --model NAME, or a model name with --pretrained (timm's weights) or
--pretrained PATH (--model NAME alone: timm's weights). Class folders are matched to the
model's classes by name; on a 1000-class ImageNet head without stored names, by WordNet id
(folders n01440764, ...: whichever subset of the 1000 is present), reported under the labels
predict prints ("tench, Tinca tinca").

Outputs (confusion_matrix.png, report.json) go to --output-dir, by default RUN/eval-DATA/ for a
run folder or a run's weights file, and ./eval-NAME-DATA/ for any other file or a model name
(never silently into a folder of weights); the last line says where they went.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Only light modules here: --help and flag errors must not wait for torch.
from vit.cli import (
    AT_LEAST_0,
    AT_LEAST_1,
    TTA_CHOICES,
    ArgumentParser,
    add_model_arguments,
    default_workers,
    missing_model_argument,
    number_in,
    unwritable,
)

if TYPE_CHECKING:
    from vit.model import VisionTransformer

RUN_WEIGHTS = ("model.safetensors", "best.safetensors")  # the names a run folder's weights have


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="evaluate.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(p)
    p.add_argument(
        "--data",
        required=True,
        help="cifar10, cifar100, or a folder with test/ (or val/) class folders",
    )
    p.add_argument("--data-root", default="data", help="where CIFAR is downloaded")
    p.add_argument("--split", default="test", choices=("test", "train"))
    p.add_argument(
        "--subset", type=number_in(AT_LEAST_1), help="evaluate on N images, stratified by class"
    )
    p.add_argument("--batch-size", type=number_in(AT_LEAST_1), default=256)
    workers = default_workers()
    p.add_argument(
        "--workers",
        type=number_in(AT_LEAST_0),
        default=workers,
        help=f"data loader processes (default: one per spare core, at most 4: {workers} here)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    p.add_argument(
        "--tta",
        default="none",
        choices=TTA_CHOICES,
        help="test-time augmentation: flip also scores the mean of each image's and its mirror "
        "image's probabilities, reported beside the plain figures",
    )
    p.add_argument(
        "--json", type=Path, help="write the report here (default: OUTPUT_DIR/report.json)"
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        help="where confusion_matrix.png (and report.json) go (default: RUN/eval-DATA/ for a "
        "run's weights, else ./eval-NAME-DATA/)",
    )
    return p


def model_argument(args: argparse.Namespace) -> str:
    """What names the evaluated model: --checkpoint, else --model."""
    return str(args.checkpoint if args.checkpoint is not None else args.model)


def default_output_dir(checkpoint: str, data: str, split: str = "test") -> Path:
    """RUN/eval-DATA for a run folder or its model.safetensors (RUN/eval-best-DATA for its
    best.safetensors, and so on); ./eval-NAME-DATA for any other file or folder (a folder of
    downloaded weights, such as a transformers folder, is not the place) or a model name.
    `-train` is appended for the training split, so that no evaluation replaces another's
    report."""
    from vit.checkpoint import CONFIG_FILE, STATE_FILE

    data_name = (Path(data.rstrip("/")).name or data) + ("" if split == "test" else f"-{split}")
    path = Path(checkpoint)
    folder = path if path.is_dir() else path.parent
    downloaded = (folder / "config.json").is_file()  # a transformers folder
    if path.is_dir() and not downloaded:
        return path / f"eval-{data_name}"
    in_run = path.name in RUN_WEIGHTS or any(
        (folder / name).is_file() for name in (CONFIG_FILE, STATE_FILE)
    )
    if path.is_file() and in_run and not downloaded:
        weights = "" if path.name == RUN_WEIGHTS[0] else f"{path.stem}-"
        return folder / f"eval-{weights}{data_name}"
    name = path.name if path.is_dir() else path.stem if path.is_file() else checkpoint
    return Path(f"eval-{name}-{data_name}")


def data_problem(data: str, split: str) -> str | None:
    """Why --data cannot be read (None if it may be), found before the model is loaded: not
    a known data set name nor a folder, or a folder without the split's subfolder."""
    from vit.data import TORCHVISION_DATASETS, find_split_dir

    if data.lower() in TORCHVISION_DATASETS:
        return None
    root = Path(data)
    if not root.is_dir():
        subfolder = "a train/" if split == "train" else "a test/ (or val/)"
        return (
            f"--data {data}: neither one of {', '.join(TORCHVISION_DATASETS)} nor an existing "
            f"folder with {subfolder} subfolder of class folders"
        )
    try:
        find_split_dir(root, split)
    except FileNotFoundError as e:
        return f"--data {data}: {e}"
    return None


def imagenet_class_ids() -> list[str]:
    """The 1000 ImageNet-1k WordNet ids in class-index order (timm ships the list)."""
    from timm.data import ImageNetInfo

    return list(ImageNetInfo().label_names())


def label_mapping(data_classes: list[str], model: VisionTransformer) -> list[int]:
    """Index map from the dataset's class order to the model's output order: by the model's
    stored class names; on a 1000-class head without them, by ImageNet WordNet id; otherwise
    the folder order must be the model's (same count)."""
    stored = model.class_names
    if not stored and model.num_classes == 1000:
        stored, what = imagenet_class_ids(), "ImageNet WordNet ids (n01440764, ...)"
    else:
        what = "the model's class names"
    if not stored:
        if len(data_classes) != model.num_classes:
            raise ValueError(
                f"the data has {len(data_classes)} classes and the model {model.num_classes} "
                f"outputs, and the model has no class names to match them by"
            )
        return list(range(len(data_classes)))
    missing = [c for c in data_classes if c not in stored]
    if missing:
        raise ValueError(
            f"data classes {missing[:10]} are not among {what} (first ones: {stored[:10]}); "
            f"the class folder names must match them"
        )
    return [stored.index(c) for c in data_classes]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = missing_model_argument(args)
    if problem:
        parser.error(problem)
    out_dir = args.output_dir or default_output_dir(model_argument(args), args.data, args.split)
    json_path = args.json or out_dir / "report.json"
    for flag, path, folder in (("--output-dir", out_dir, True), ("--json", json_path, False)):
        problem = unwritable(flag, path, folder)
        if problem:
            parser.error(problem)
    from vit.images import CorruptImageError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        report = run(args, out_dir, json_path)
    except (CorruptImageError, FileNotFoundError, ValueError) as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        return 2
    print(
        f"top-1 {100 * report['top1']:.2f}%  top-5 {100 * report['top5']:.2f}%  "
        f"on {report['num_images']} images"
    )
    if "tta" in report:
        tta = report["tta"]
        print(
            f"top-1 {100 * tta['top1']:.2f}%  top-5 {100 * tta['top5']:.2f}%  "
            f"with {tta['method']} test-time augmentation"
        )
    print(f"evaluate.py: wrote {report['confusion_matrix_png']} and {json_path}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace, out_dir: Path, json_path: Path) -> dict:
    """Evaluate, then write the confusion matrix PNG into `out_dir` and the report to
    `json_path`; returns the report."""
    from vit.data import load_split
    from vit.distributed import DistInfo, resolve_device
    from vit.engine import evaluate
    from vit.factory import class_names_for, model_from_flags
    from vit.io import atomic_write
    from vit.loaders import eval_loader
    from vit.plots import plot_confusion_matrix, save_figure
    from vit.transforms import EvalTransform

    problem = data_problem(args.data, args.split)
    if problem:  # before the model: loading one can take a while
        raise FileNotFoundError(problem)
    device = resolve_device(args.device, DistInfo())
    model = model_from_flags(args).to(device)
    if model.num_classes == 0:
        flag = "--checkpoint" if args.checkpoint is not None else "--model"
        raise ValueError(
            f"{flag} {model_argument(args)}: the model has no classifier head (num_classes=0, a "
            f"feature extractor): nothing to evaluate; python -m vit.predict --features FILE "
            f"embeds images with it"
        )
    data = load_split(
        args.data,
        args.split,
        args.data_root,
        subset=args.subset,
        transform=EvalTransform(model.preprocess),
    )
    mapping = label_mapping(data.class_names, model)
    class_names = class_names_for(model)  # the names predict prints
    # Labels in the model's index space; the confusion matrix is over the model's classes.
    dataset = data.relabel(mapping, class_names)
    loader = eval_loader(
        dataset,
        batch_size=args.batch_size,
        workers=args.workers,
        info=DistInfo(),
        pin=device.type == "cuda",
    )
    result = evaluate(
        model,
        loader,
        num_classes=model.num_classes,
        device=device,
        amp=args.amp,
        progress=True,
        tta=args.tta,
    )

    # Report only the classes present in the data (ImageNet subsets would list 1000 otherwise).
    present = sorted(set(mapping))
    confusion = result["confusion"][present][:, present]
    names = [class_names[i] for i in present]
    data_name = Path(args.data.rstrip("/")).name
    out_dir.mkdir(parents=True, exist_ok=True)
    top1 = f"top-1 {100 * result['top1']:.1f}%"
    title = f"{model_argument(args)} on {data_name} ({args.split}): {top1}"
    figure = plot_confusion_matrix(confusion, names, title=title)
    png = save_figure(figure, out_dir / "confusion_matrix.png")
    report = {
        "top1": result["top1"],
        "top5": result["top5"],
        "per_class": {class_names[i]: result["per_class"][i] for i in present},
        "num_images": result["num_images"],
        "loss": result["loss"],
        "checkpoint": model_argument(args),
        "data": args.data,
        "split": args.split,
        "confusion_matrix": confusion.tolist(),
        "confusion_matrix_png": str(png),
    }
    if "tta" in result:
        tta = result["tta"]
        report["tta"] = {
            "method": args.tta,
            **{key: tta[key] for key in ("top1", "top5", "loss")},
            "per_class": {class_names[i]: tta["per_class"][i] for i in present},
        }
    atomic_write(Path(json_path), lambda tmp: tmp.write_text(json.dumps(report, indent=2)))
    return report


if __name__ == "__main__":
    sys.exit(main())
