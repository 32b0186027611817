"""Evaluate a trained ViT: top-1, top-5, per-class accuracy, a confusion matrix PNG, a JSON report.

    python -m vit.evaluate --checkpoint runs/RUN --data cifar10
    python -m vit.evaluate --checkpoint runs/RUN/best.safetensors --data folder --json r.json
    python -m vit.evaluate --checkpoint vit_base_patch16_224 --pretrained --data path/to/imagenet
    python -m vit.evaluate --checkpoint path/to/hf-folder --data path/to/imagenet
    python -m vit.evaluate --checkpoint timm_weights.pth --model vit_small_patch16_224 --data ...

`vit-evaluate` once the package is installed; `python evaluate.py` in a checkout.

The model argument is read as by `python -m vit.predict` and `vit.export`: a run folder (its
model.safetensors) or a weights file in it, our .safetensors, a transformers folder, a weights
file of another layout with --model NAME, or a model name with --pretrained (timm's weights) or
--pretrained PATH (--model NAME alone: timm's weights). An ONNX file exported by `vit.export`
is run in onnxruntime, with the same report (--amp needs the PyTorch model; --knn and
--linear-probe a headless model's file, whose output is the pooled embedding). Class folders
are matched to the model's classes by name; on a 1000-class ImageNet head without stored
names, by WordNet id (folders n01440764, ...: whichever subset of the 1000 is present),
reported under the labels predict prints ("tench, Tinca tinca").

A backbone's features, headless or not, are scored with --knn (weighted kNN, DINO's protocol:
cosine similarity, the k nearest training images vote with weight exp(similarity / 0.07),
k = 10, 20, 100, 200) and --linear-probe (CLIP's: logistic regression, its L2 strength chosen
on a held-out part of the training split, refitted on all of it); both fit on the data's
train/ split and score its test/ (or val/) split (`vit.inference.probe`):

    python -m vit.evaluate --checkpoint path/to/dinov2-folder --data path/to/folder \\
        --knn --linear-probe

The pooled embedding of each image is extracted once per split and kept beside the report
(OUTPUT_DIR/features-train.npz, features-test.npz, with the model's and data's digests): a
second evaluation of the same model on the same data reuses them. --subset N bounds both
splits for a quick look (stratified by class), --train-subset N the training split alone. A
model with a head is scored by its head too, beside its features.

Outputs (confusion_matrix.png, report.json) go to --output-dir, by default RUN/eval-DATA/ for a
run folder or a run's weights file, and ./eval-NAME-DATA/ for any other file or a model name
(never silently into a folder of weights); the last line says where they went. --json FILE
puts the report there instead, its confusion matrix beside it (FILE's stem +
_confusion_matrix.png), and an existing FILE is replaced only with --overwrite. In the output
folder, an evaluation replaces its own reports and caches; a file of those names that it did not
write is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

# Only light modules here: --help and flag errors must not wait for torch.
from vit.cli.flags import (
    ArgumentParser,
    add_data_root_argument,
    add_model_arguments,
    add_model_dtype_argument,
    add_runtime_argument,
    add_threads_argument,
    command_name,
    disk_full,
    interrupt_status,
    kept_output,
    missing_model_argument,
    number_in,
    runtime_problem,
    sigterm_as_ctrl_c,
    stopped_how,
    unwritable,
)
from vit.data.workers import default_workers
from vit.inference.options import KNN_KS, TTA_CHOICES
from vit.utils import locks
from vit.utils.ranges import AT_LEAST_0, AT_LEAST_1

if TYPE_CHECKING:
    import numpy as np
    import torch
    from matplotlib.figure import Figure

    from vit.data.datasets import ImageDataset
    from vit.models.vision_transformer import VisionTransformer

RUN_WEIGHTS = ("model.safetensors", "best.safetensors")  # the names a run folder's weights have
# The command as the user ran it, which its usage line and messages start with: `python -m
# vit.evaluate`, `vit-evaluate`, or evaluate.py (the repository's file, and main() from Python).
PROG = command_name(__name__, "vit.evaluate", script="evaluate.py")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(p)
    p.add_argument(
        "--data",
        required=True,
        help="cifar10, cifar100, or a folder with test/ (or val/) class folders",
    )
    add_data_root_argument(p)
    p.add_argument("--split", default="test", choices=("test", "train"))
    p.add_argument(
        "--subset",
        type=number_in(AT_LEAST_1),
        help="evaluate on N images, stratified by class (with --knn/--linear-probe also N "
        "training images, unless --train-subset says otherwise)",
    )
    add_probe_arguments(p)
    p.add_argument("--batch-size", type=number_in(AT_LEAST_1), default=256)
    workers = default_workers()
    p.add_argument(
        "--workers",
        type=number_in(AT_LEAST_0),
        default=workers,
        help=f"data loader processes (default: one per spare core, at most 4: {workers} here)",
    )
    p.add_argument("--device", default="auto")
    add_threads_argument(p)
    add_model_dtype_argument(p)
    add_runtime_argument(p)
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    p.add_argument(
        "--tta",
        default="none",
        choices=TTA_CHOICES,
        help="test-time augmentation of the classifier head, reported beside the plain "
        "figures: the mean probability of each image's views: flip (and its mirror image, 2x "
        "the compute), shift (moved 1/16 of its side four ways, 5x), flip-shift (both, 10x)",
    )
    p.add_argument(
        "--json",
        type=Path,
        help="write the report here, its confusion matrix beside it as STEM_confusion_matrix.png "
        "(default: OUTPUT_DIR/report.json and confusion_matrix.png)",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        help="where report.json, confusion_matrix.png and the feature caches go (default: "
        "RUN/eval-DATA/ for a run's weights, else ./eval-NAME-DATA/)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --json file and its PNG, or files in --output-dir of the "
        "names an evaluation writes that it did not write (refused otherwise; its own reports and "
        "feature caches there are replaced by the next evaluation)",
    )
    return p


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that score a model's frozen features (`vit.inference.probe`): --knn,
    --linear-probe and their settings."""
    p.add_argument(
        "--train-subset",
        type=number_in(AT_LEAST_1),
        help="--knn/--linear-probe: fit on N training images, stratified by class",
    )
    p.add_argument(
        "--knn",
        action="store_true",
        help="score the model's features by weighted kNN against the train split (DINO's "
        "protocol; see vit.inference.probe)",
    )
    p.add_argument(
        "--knn-k",
        type=number_in(AT_LEAST_1),
        nargs="+",
        default=list(KNN_KS),
        metavar="K",
        help=f"the k of --knn (default: {' '.join(map(str, KNN_KS))}; the report leads with 20)",
    )
    p.add_argument(
        "--linear-probe",
        action="store_true",
        help="score the model's features by logistic regression fitted on the train split, "
        "its L2 strength chosen on a held-out part of it (CLIP's protocol; see "
        "vit.inference.probe)",
    )
    p.add_argument(
        "--embedding",
        default="pooled",
        metavar="NAME",
        help="the features --knn and --linear-probe score: pooled (default: the pre-logits "
        "features), clstoken, clstoken_avgpool (DINOv2's linear protocol), last4_clstoken "
        "(DINO's; any lastN_clstoken), image_embeds (CLIP's projection), output",
    )
    p.add_argument(
        "--seed",
        type=number_in(AT_LEAST_0),
        default=0,
        help="picks --subset/--train-subset images and the linear probe's held-out part",
    )


def model_argument(args: argparse.Namespace) -> str:
    """What names the evaluated model: --checkpoint, else --model."""
    return str(args.checkpoint if args.checkpoint is not None else args.model)


def default_output_dir(checkpoint: str, data: str, split: str = "test") -> Path:
    """RUN/eval-DATA for a run folder or its model.safetensors (RUN/eval-best-DATA for its
    best.safetensors, and so on); ./eval-NAME-DATA for any other file or folder (a folder of
    downloaded weights, such as a transformers folder, is not the place) or a model name.
    `-train` is appended for the training split, so that no evaluation replaces another's
    report."""
    from vit.training.checkpoint import CONFIG_FILE, STATE_FILE

    name = Path(data.rstrip("/")).name or Path(data).resolve().name  # "." -> the folder's
    data_name = (name or data) + ("" if split == "test" else f"-{split}")
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


REPORT_KEYS = {"checkpoint", "data"}  # in every report evaluate.py has written


def others_files(args: argparse.Namespace, out_dir: Path, json_path: Path) -> list[Path]:
    """The files of OUTPUT_DIR this evaluation would replace that evaluate.py did not write (a
    report.json, confusion_matrix.png or features-SPLIT.npz of the user's): kept unless
    --overwrite. evaluate.py's own are replaced: a stale cache, the last evaluation's report."""
    found = []
    if args.json is None:  # (an existing --json FILE is refused whoever wrote it)
        try:
            report = json.loads(json_path.read_text())
        except (OSError, ValueError):
            report = None
        ours = isinstance(report, dict) and REPORT_KEYS <= set(report)
        if json_path.exists() and not ours:
            found.append(json_path)
        png = confusion_png(json_path)  # ours if our report names it
        named = Path(report.get("confusion_matrix_png", "")).name if ours else None
        if png.exists() and named != png.name:
            found.append(png)
    if args.knn or args.linear_probe:
        from vit.inference.probe import is_feature_cache

        caches = [feature_cache(out_dir, split) for split in ("train", "test")]
        found += [cache for cache in caches if cache.exists() and not is_feature_cache(cache)]
    return found


def feature_cache(out_dir: Path, split: str) -> Path:
    """Where --knn and --linear-probe keep a split's features: OUTPUT_DIR/features-SPLIT.npz."""
    return out_dir / f"features-{split}.npz"


def confusion_png(json_path: Path) -> Path:
    """The confusion matrix beside its report: report.json's is confusion_matrix.png, r.json's
    r_confusion_matrix.png."""
    json_path = Path(json_path)
    stem = "" if json_path.name == "report.json" else f"{json_path.stem}_"
    return json_path.with_name(f"{stem}confusion_matrix.png")


def data_problem(data: str, split: str) -> str | None:
    """Why --data cannot be read (None if it may be), found before the model is loaded: not
    a known data set name nor a folder, or a folder without the split's subfolder."""
    from vit.data.datasets import TORCHVISION_DATASETS, find_split_dir

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
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # each process would evaluate everything
        if os.environ.get("RANK", "0") != "0":
            return 2  # rank 0 says why
        parser.error(
            "runs in one process: start it without torchrun (python -m vit.predict --features "
            "splits images between processes)"
        )
    problem = missing_model_argument(args) or runtime_problem(args)
    if problem:
        parser.error(problem)
    if (args.knn or args.linear_probe) and args.split == "train":
        parser.error(
            f"{probe_flags(args)} fit on the train split and score the test split: leave out "
            f"--split train"
        )
    out_dir = args.output_dir or default_output_dir(model_argument(args), args.data, args.split)
    json_path = args.json or out_dir / "report.json"
    for flag, path, folder in (("--output-dir", out_dir, True), ("--json", json_path, False)):
        problem = unwritable(flag, path, folder)
        if problem and flag == "--output-dir" and args.output_dir is None:  # the default's
            problem += "; give an --output-dir"
        if problem:
            parser.error(problem)
    if args.json is not None:  # a file the user named: what is there may be theirs
        for path in (args.json, confusion_png(args.json)):
            problem = kept_output("--json", path, args.overwrite)
            if problem:
                parser.error(problem)
    if not args.overwrite:
        for path in others_files(args, out_dir, json_path):
            parser.error(
                f"--output-dir {out_dir}: {path.name} there is not one {PROG} wrote, and "
                f"this evaluation would replace it; add --overwrite to replace it, or choose "
                f"another --output-dir"
            )
    from vit.data.images import CorruptImageError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        with sigterm_as_ctrl_c(), one_writer(out_dir, json_path):
            report = run(args, out_dir, json_path)
    except (CorruptImageError, FileNotFoundError, ValueError, locks.LockError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: one line, what was kept, how to go on
        print(interrupted_message(out_dir, json_path, how=stopped_how(e)), file=sys.stderr)
        return interrupt_status(e)
    except OSError as e:
        how = disk_full(e)
        if how is None:
            raise
        print(interrupted_message(out_dir, json_path, how=how), file=sys.stderr)
        return 1
    if "top1" in report:
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
    print_probes(report)
    written = [report["confusion_matrix_png"]] if "confusion_matrix_png" in report else []
    written += [split["path"] for split in report.get("features", {}).get("splits", {}).values()]
    print(
        f"{PROG}: wrote {', '.join(written) + ' and ' if written else ''}{json_path}",
        file=sys.stderr,
    )
    return 0


def interrupted_message(out_dir: Path, json_path: Path, how: str = "interrupted") -> str:
    """After Ctrl-C (or `how` it stopped): the report is not written; a feature extraction's
    finished shards are kept, and the same command continues from them."""
    from vit.inference.embed import finished_shards
    from vit.inference.probe import extraction_path

    line = f"{PROG}: {how}; {json_path} not written"
    caches = [feature_cache(out_dir, split) for split in ("train", "test")]
    shards = sum(finished_shards(extraction_path(cache)) for cache in caches)
    if shards:
        line += (
            f"; {shards} finished shard{'' if shards == 1 else 's'} of the features kept in "
            f"{out_dir}, from which the same command continues"
        )
    return line


@contextlib.contextmanager
def one_writer(out_dir: Path, json_path: Path):
    """Hold the output folder (and the report, when --json puts it elsewhere) for this process
    alone while it writes there: another evaluate.py writing the same report is refused."""
    with contextlib.ExitStack() as held:
        held.enter_context(locks.hold(out_dir, folder=True))
        if Path(json_path).resolve().parent != Path(out_dir).resolve():
            held.enter_context(locks.hold(json_path, folder=False))
        yield


def probe_flags(args: argparse.Namespace) -> str:
    """The feature-scoring flags given, as the user wrote them: "--knn and --linear-probe"."""
    given = (("--knn", args.knn), ("--linear-probe", args.linear_probe))
    return " and ".join(flag for flag, on in given if on)


def print_probes(report: dict) -> None:
    """The kNN table (k | top-1 | top-5) and the linear probe's line, for what was run."""
    if "knn" in report:
        knn = report["knn"]
        print(
            f"kNN on {knn['embedding']} features: {knn['train_images']} train / "
            f"{knn['test_images']} test images, cosine, T = {knn['temperature']:g}"
        )
        print(f"{'k':>5}  {'top-1':>7}  {'top-5':>7}")
        for k, scores in knn["by_k"].items():
            print(f"{k:>5}  {100 * scores['top1']:6.2f}%  {100 * scores['top5']:6.2f}%")
    if "linear_probe" in report:
        probe = report["linear_probe"]
        print(
            f"linear probe: top-1 {100 * probe['top1']:.2f}%  top-5 {100 * probe['top5']:.2f}%  "
            f"(L2 {probe['l2']:.3g}, chosen among {len(probe['search'])} on "
            f"{probe['heldout_images']} held-out training images)"
        )


def run(args: argparse.Namespace, out_dir: Path, json_path: Path) -> dict:
    """Evaluate the model's head (if it has one) and, with --knn/--linear-probe, its features;
    write the report to `json_path` (and the confusion matrix PNG, feature caches into
    `out_dir`); returns the report."""
    from vit.cli.flags import use_threads
    from vit.cli.model_argument import model_from_flags
    from vit.inference.embed import POOL_HINT, POOLS_NOTHING, pools_nothing
    from vit.inference.precision import cast_for_inference
    from vit.interop.onnx_runtime import onnx_device, refuse_flags
    from vit.utils.files import atomic_write
    from vit.utils.plots import save_figure
    from vit.utils.process_group import DistInfo, resolve_device

    probing = args.knn or args.linear_probe
    problem = data_problem(args.data, args.split)
    if problem:  # before the model: loading one can take a while
        raise FileNotFoundError(problem)
    if probing:
        problem = data_problem(args.data, "train")
        if problem:
            raise FileNotFoundError(f"{problem} ({probe_flags(args)} fit on the training split)")
    use_threads(args.threads)
    device = resolve_device(onnx_device(args), DistInfo())
    model = model_from_flags(args, onnx=args.runtime).to(device)
    given = {
        "--amp": args.amp,
        "--model-dtype": args.model_dtype != "float32",
        "--knn": args.knn,
        "--linear-probe": args.linear_probe,
    }
    refuse_flags(model, given, args.embedding)
    warning = cast_for_inference(model, args.model_dtype, device)
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    flag = "--checkpoint" if args.checkpoint is not None else "--model"
    if model.num_classes == 0 and not probing:
        raise ValueError(
            f"{flag} {model_argument(args)}: the model has no classifier head (num_classes=0, a "
            f"feature extractor): nothing to evaluate; score its features with --knn and/or "
            f"--linear-probe, or embed images with python -m vit.predict --features FILE"
        )
    if model.num_classes > 0 and pools_nothing(model):
        raise ValueError(
            f"{flag} {model_argument(args)}: {POOLS_NOTHING}, its head classifying every "
            f"token; {POOL_HINT}"
        )
    if model.num_classes == 0 and args.tta != "none":  # else --tta would be silently ignored
        raise ValueError(
            f"--tta {args.tta}: averages the classifier head's probabilities over views, and "
            f"{flag} {model_argument(args)} has no head (num_classes=0); leave out --tta "
            f"(--knn and --linear-probe score each image's features once)"
        )
    # Every mistake is said before anything is written: the head's data (its classes must be
    # the model's) and the features (k, finite values) are checked before the head is scored.
    scored_data = head_data(args, model) if model.num_classes > 0 else None
    features = split_features(args, model, device, out_dir) if probing else None
    png = confusion_png(json_path)
    report, figure = {}, None
    if scored_data is not None:
        report, figure = evaluate_head(args, model, device, png, scored_data)
    report.update(
        checkpoint=model_argument(args),
        runtime=getattr(model, "runtime", "pytorch"),  # an ONNX file's: onnxruntime or openvino
        model_dtype=args.model_dtype,
        data=args.data,
        split=args.split,
    )
    if features is not None:
        report.update(score_features(args, *features))

    def write_report(tmp: Path) -> None:
        tmp.write_text(json.dumps(report, indent=2))

    if figure is None:
        atomic_write(Path(json_path), write_report)
    else:  # the report and its matrix replace the old ones together, or neither (a full disk)
        save_figure(figure, png, beside={Path(json_path): write_report})
    return report


def head_data(args: argparse.Namespace, model: VisionTransformer) -> tuple[ImageDataset, list[int]]:
    """The --split images the head is scored on, labelled in the model's index space, and the
    map from the data's classes to the model's (a mismatch raises ValueError)."""
    from vit.data.datasets import load_split
    from vit.data.transforms import EvalTransform
    from vit.models.class_names import class_names_for

    data = load_split(
        args.data,
        args.split,
        args.data_root,
        subset=args.subset,
        seed=args.seed,
        transform=EvalTransform(model.preprocess),
    )
    mapping = label_mapping(data.class_names, model)
    # Labels in the model's index space; the confusion matrix is over the model's classes.
    return data.relabel(mapping, class_names_for(model)), mapping


def evaluate_head(
    args: argparse.Namespace,
    model: VisionTransformer,
    device: torch.device,
    png_path: Path,
    data: tuple[ImageDataset, list[int]],
) -> tuple[dict, Figure]:
    """The head's top-1, top-5, per-class accuracy and confusion matrix on `data` (from
    `head_data`), and the matrix drawn, for `png_path`."""
    from vit.data.loaders import eval_loader
    from vit.inference.evaluation import evaluate
    from vit.utils.plots import plot_confusion_matrix
    from vit.utils.process_group import DistInfo

    dataset, mapping = data
    class_names = dataset.class_names
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
    png_path.parent.mkdir(parents=True, exist_ok=True)
    top1 = f"top-1 {100 * result['top1']:.1f}%"
    title = f"{model_argument(args)} on {data_name} ({args.split}): {top1}"
    figure = plot_confusion_matrix(confusion, names, title=title)
    report = {
        "top1": result["top1"],
        "top5": result["top5"],
        "per_class": {class_names[i]: result["per_class"][i] for i in present},
        "num_images": result["num_images"],
        "loss": result["loss"],
        "confusion_matrix": confusion.tolist(),
        "confusion_matrix_png": str(png_path),
    }
    if "tta" in result:
        tta = result["tta"]
        report["tta"] = {
            "method": args.tta,
            **{key: tta[key] for key in ("top1", "top5", "loss")},
            "per_class": {class_names[i]: tta["per_class"][i] for i in present},
        }
    return report, figure


def probe_splits(args: argparse.Namespace, model: VisionTransformer) -> dict[str, ImageDataset]:
    """The train and test splits the features are taken from, both labelled by the train
    split's classes (--train-subset, else --subset, bounds the first; --subset the second)."""
    from vit.data.datasets import load_split
    from vit.data.transforms import EvalTransform

    splits = {}
    for split, subset in (("train", args.train_subset or args.subset), ("test", args.subset)):
        splits[split] = load_split(
            args.data,
            split,
            args.data_root,
            subset=subset,
            seed=args.seed,
            transform=EvalTransform(model.preprocess),
        )
    train, test = splits["train"], splits["test"]
    unknown = [name for name in test.class_names if name not in train.class_names]
    if unknown:
        raise ValueError(
            f"--data {args.data}: test classes {unknown[:10]} have no training images; the "
            f"train split's classes are {train.class_names[:10]}"
        )
    mapping = [train.class_names.index(name) for name in test.class_names]
    splits["test"] = test.relabel(mapping, train.class_names)
    return splits


def split_features(
    args: argparse.Namespace, model: VisionTransformer, device: torch.device, out_dir: Path
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """The model's pooled features (N, D) and labels (N,) of the train and test splits, by
    split name, extracted once into OUTPUT_DIR/features-{train,test}.npz (reused when they
    match), and what the extraction took."""
    from vit.inference.embed import check_embedding
    from vit.inference.probe import check_ks, dataset_features

    check_embedding(model, args.embedding)  # before the data is read: a mistake is said at once
    splits = probe_splits(args, model)
    if args.knn:  # before the extraction: a mistake is said at once
        check_ks(args.knn_k, len(splits["train"]))
    features, labels, extraction = {}, {}, {}
    for split, dataset in splits.items():
        cache = feature_cache(out_dir, split)
        before = cache.stat().st_mtime_ns if cache.is_file() else None
        start = time.perf_counter()
        features[split], labels[split] = dataset_features(
            model,
            dataset,
            cache,
            identity={"embedding": args.embedding},
            batch_size=args.batch_size,
            workers=args.workers,
            device=device,
            amp=args.amp,
        )
        seconds = time.perf_counter() - start
        reused = before is not None and cache.stat().st_mtime_ns == before
        extraction[split] = {
            "path": str(cache),
            "images": len(dataset),
            "dim": int(features[split].shape[1]),
            "reused": reused,
            "seconds": seconds,
            **({} if reused else {"images_per_s": len(dataset) / seconds}),
        }
    return features, labels, {"embedding": args.embedding, "splits": extraction}


def score_features(
    args: argparse.Namespace,
    features: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    extraction: dict,
) -> dict:
    """The report's `features`, and with --knn `knn_top1` and `knn`, with --linear-probe
    `linear_probe_top1` and `linear_probe`."""
    from vit.inference.probe import KNN_LEAD_K, KNN_TEMPERATURE, knn_accuracy, linear_probe

    report: dict = {"features": extraction}
    train, test = (features["train"], labels["train"]), (features["test"], labels["test"])
    if args.knn:
        ks = sorted(set(args.knn_k))
        by_k = knn_accuracy(*train, *test, ks=ks)
        lead = KNN_LEAD_K if KNN_LEAD_K in by_k else ks[0]
        report["knn_top1"] = by_k[lead]["top1"]
        report["knn"] = {
            "lead_k": lead,
            "by_k": {str(k): scores for k, scores in by_k.items()},
            "temperature": KNN_TEMPERATURE,
            "similarity": "cosine (L2-normalised features)",
            "embedding": extraction["embedding"],
            "train_images": len(train[1]),
            "test_images": len(test[1]),
        }
    if args.linear_probe:
        probe = linear_probe(*train, *test, seed=args.seed)
        report["linear_probe_top1"] = probe["top1"]
        report["linear_probe"] = {"embedding": extraction["embedding"], **probe}
    return report


if __name__ == "__main__":
    sys.exit(main())
