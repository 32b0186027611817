"""Classify images from the command line: files, folders and glob patterns, in batches.

    python -m vit.predict IMAGE|FOLDER|GLOB ... (--checkpoint SRC [--model NAME] | --model NAME)
        [--pretrained [PATH]] [--top-k 5] [--batch-size 32] [--device auto]
        [--output preds.csv|preds.json]
        [--explain DIR [--method rollout|gradient_rollout|relevance]]
        [--features FILE.npz|.csv|.json [--embedding pooled|output]]

The model argument is read as by evaluate.py and `vit.export` (`vit.factory.resolve_model`):
--checkpoint is a train.py run folder (its model.safetensors) or a weights file in it, one of
our `.safetensors` files, a transformers folder (their architecture and class names are
stored), a weights file of another layout (timm, torchvision, transformers state dicts, Google
.npz) with --model NAME, or a model name with --pretrained (timm's weights) or --pretrained
PATH. --model NAME alone means timm's pretrained weights for that name (downloaded once).

Images are prepared exactly as `evaluate.py` prepares them (the model's resize, centre crop and
normalisation), so the top-1 class here is evaluate's, under the class names evaluate
reports (`vit.factory.class_names_for`). Without --output the top-k classes are printed per
image; with it, one record per image is written (CSV or JSON: path, label, probability,
label_2, probability_2, ...). A file that cannot be read is named on stderr, the
other images are still classified, and the exit status is 1 at the end.

--features FILE writes one pooled embedding per image with its path: the model's pre-logits
features (`forward_head(x, pre_logits=True)`, what a headless backbone such as DINOv2 returns
as `model(x)`), or with --embedding output the model's output itself (for a CLIP image tower
whose head is the projection into the text space, `image_embeds`). FILE.npz holds two arrays,
`paths` (N,) and `features` (N, D) float32 (`np.load(FILE)`, no pickle); FILE.csv one row per
image, `path, f0, ..., f{D-1}`; FILE.json a list of {"path", "embedding"}. A model without a
classifier head (num_classes=0) classifies nothing: it takes --features and --explain (rollout)
only. Nothing is written when no image could be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import TTA_CHOICES, ArgumentParser, add_model_arguments

METHOD_NAMES = ("gradient_rollout", "relevance", "rollout")  # --method: maps of vit.explain
OUTPUT_SUFFIXES = (".csv", ".json")
FEATURE_SUFFIXES = (".npz", ".csv", ".json")
EMBEDDINGS = {"pooled": "pooled pre-logits features", "output": "the model's output"}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(  # a bad flag: one line, not the usage text
        prog="python -m vit.predict",
        description="Top-k classes for each image.",
    )
    parser.add_argument(
        "images", nargs="+", help="image files, folders (searched recursively) or glob patterns"
    )
    add_model_arguments(parser)
    parser.add_argument("--top-k", type=int, default=5, help="classes per image (default 5)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    parser.add_argument("--workers", type=int, default=4, help="threads decoding images")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda:0")
    parser.add_argument("--output", type=Path, help="write the predictions to FILE.csv or .json")
    parser.add_argument("--explain", type=Path, metavar="DIR", help="one attention PNG per image")
    parser.add_argument(
        "--method", choices=sorted(METHOD_NAMES), default="rollout", help="map for --explain"
    )
    parser.add_argument(
        "--tta",
        choices=TTA_CHOICES,
        default="none",
        help="test-time augmentation: flip classifies by the mean probability of each image and "
        "its mirror image (twice the compute)",
    )
    parser.add_argument(
        "--features",
        type=Path,
        metavar="FILE",
        help="write one pooled embedding per image with its path: FILE.npz (arrays paths, "
        "features), .csv (path, f0, f1, ...) or .json",
    )
    parser.add_argument(
        "--embedding",
        choices=("pooled", "output"),
        default="pooled",
        help="for --features: the pooled pre-logits features (default) or the model's output "
        "(a CLIP tower's projection into the text space)",
    )
    return parser


if __name__ == "__main__":
    # `python -m vit.predict`: --help and flag mistakes are answered before the imports below
    # load torch and matplotlib (seconds); main() reads the flags again, at no cost.
    build_parser().parse_args()

# ruff: noqa: E402  (the imports below come after the early answer above, on purpose)
import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image
from tqdm import tqdm

from . import explain
from .cli import missing_model_argument, unwritable
from .distributed import DistInfo, resolve_device
from .factory import class_names_for, create_transform, model_from_flags
from .images import CorruptImageError, expand_image_paths, open_image
from .io import atomic_write, atomic_write_text
from .model import VisionTransformer
from .plots import denormalize, draw_overlay, save_figure
from .tta import mean_probability

METHODS = {
    "rollout": explain.attention_rollout,
    "gradient_rollout": explain.gradient_rollout,
    "relevance": explain.relevance,
}


class InputError(Exception):
    """A problem with what the user passed, reported as one line without a traceback."""


@torch.inference_mode()
def predict(model: VisionTransformer, images: list[Image.Image], top_k: int) -> tuple:
    """PIL images -> (probabilities, class indices), each (B, top_k), best first."""
    transform = create_transform(model.preprocess)
    batch = torch.stack([transform(image) for image in images])  # (B, 3, H, W)
    device = next(model.parameters()).device
    return top_classes(model, batch.to(device), top_k)


@torch.inference_mode()
def top_classes(model: VisionTransformer, batch: torch.Tensor, top_k: int) -> tuple:
    """A prepared batch (B, 3, H, W) -> (probabilities, class indices), each (B, k), best first."""
    return best_of(model.eval()(batch), top_k)


def best_of(logits: torch.Tensor, top_k: int) -> tuple:
    """Logits (B, num_classes) -> (probabilities, class indices), each (B, k), best first."""
    probs = logits.float().softmax(dim=-1)  # (B, num_classes)
    return probs.topk(min(top_k, probs.shape[-1]), dim=-1)


@torch.inference_mode()
def logits_and_features(
    model: VisionTransformer, batch: torch.Tensor, embedding: str | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One pass over a prepared batch (B, 3, H, W): logits (B, num_classes), None for a headless
    model; and the embeddings (B, D) when `embedding` is "pooled" (pre-logits features) or
    "output" (the model's output), None when it is None."""
    tokens = model.eval().forward_features(batch)  # (B, N, D)
    output = model.forward_head(tokens)  # logits, or a headless model's pooled features
    features = None
    if embedding == "pooled":
        features = model.forward_head(tokens, pre_logits=True).float()
    elif embedding == "output":
        features = output.float()
    return (output if model.num_classes > 0 else None), features


def write_features(path: Path, paths: Sequence[str], features: torch.Tensor) -> None:
    """One embedding per image, with its path, as .npz, .csv or .json (see the module
    docstring), written atomically."""
    values = features.cpu().numpy().astype(np.float32)  # (N, D)
    suffix = path.suffix.lower()
    if suffix == ".npz":

        def save(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name
                np.savez(f, paths=np.array(paths, dtype=str), features=values)

        atomic_write(path, save)
        return
    # 9 significant digits: every float32 reads back exactly
    rows = [[float(f"{v:.9g}") for v in row] for row in values.tolist()]
    if suffix == ".json":
        records = [{"path": p, "embedding": row} for p, row in zip(paths, rows, strict=True)]
        atomic_write_text(path, json.dumps(records) + "\n")
        return
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["path", *(f"f{i}" for i in range(values.shape[1]))])
    writer.writerows([p, *row] for p, row in zip(paths, rows, strict=True))
    atomic_write_text(path, buffer.getvalue())


def prepared_batches(
    paths: Sequence[Path], transform, batch_size: int, workers: int
) -> Iterator[tuple[list[Path], torch.Tensor | None, list[str]]]:
    """Decode and prepare images batch by batch: (paths read, (B, 3, H, W) or None, errors)."""

    def prepare(path: Path) -> torch.Tensor | str:
        try:
            return transform(open_image(path))
        except CorruptImageError as e:
            return str(e)

    with ThreadPoolExecutor(max(1, workers)) as pool:  # PIL decodes without holding the GIL
        for start in range(0, len(paths), batch_size):
            chunk = paths[start : start + batch_size]
            results = list(pool.map(prepare, chunk))
            good = [(p, r) for p, r in zip(chunk, results, strict=True) if not isinstance(r, str)]
            errors = [r for r in results if isinstance(r, str)]
            batch = torch.stack([r for _, r in good]) if good else None
            yield [p for p, _ in good], batch, errors


def records_for(paths, probs, indices, names: list[str]) -> list[dict]:
    """One dict per image: path, label, probability, label_2, probability_2, ..."""
    records = []
    for path, row_p, row_i in zip(paths, probs.tolist(), indices.tolist(), strict=True):
        record = {"path": str(path)}
        for rank, (p, i) in enumerate(zip(row_p, row_i, strict=True), start=1):
            suffix = "" if rank == 1 else f"_{rank}"
            record[f"label{suffix}"] = names[i]
            record[f"probability{suffix}"] = round(p, 6)
        records.append(record)
    return records


def write_records(path: Path, records: list[dict], top_k: int) -> None:
    """CSV (header row, one row per image) or JSON (a list of objects), written atomically."""
    if path.suffix.lower() == ".json":
        atomic_write_text(path, json.dumps(records, indent=2) + "\n")
        return
    fields = ["path", "label", "probability"]
    fields += [
        f"{name}_{rank}" for rank in range(2, top_k + 1) for name in ("label", "probability")
    ]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    atomic_write_text(path, buffer.getvalue())


def print_records(records: list[dict], top_k: int) -> None:
    """The terminal format: the path, then one `probability  label` line per class."""
    for record in records:
        print(record["path"])
        for rank in range(1, top_k + 1):
            suffix = "" if rank == 1 else f"_{rank}"
            print(f"  {record[f'probability{suffix}']:7.2%}  {record[f'label{suffix}']}")


# -- attention overlays --------------------------------------------------------------------------
def explanation_paths(paths: Sequence[Path], folder: Path) -> dict[Path, Path]:
    """One PNG per image under `folder`, mirroring the images' folders below their common
    parent (cats/a.jpg -> DIR/cats/a.png; a.jpg and a.png side by side -> a_jpg.png, a_png.png)."""
    absolute = [p.resolve() for p in paths]
    root = Path(os.path.commonpath([p.parent for p in absolute])) if absolute else Path()
    stems: dict[Path, int] = {}
    for p in absolute:
        key = p.relative_to(root).with_suffix("")
        stems[key] = stems.get(key, 0) + 1
    out = {}
    for original, p in zip(paths, absolute, strict=True):
        rel = p.relative_to(root)
        name = rel.stem if stems[rel.with_suffix("")] == 1 else f"{rel.stem}_{rel.suffix[1:]}"
        out[original] = folder / rel.parent / f"{name}.png"
    return out


def explanation_figure(image: np.ndarray, heatmap: torch.Tensor, title: str, method: str):
    """The image (H, W, 3) in [0, 1] beside the same image with its map (gh, gw) over it."""
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.imshow(image, interpolation="nearest")
    left.set_title(title, fontsize=10)
    draw_overlay(right, image, heatmap)
    right.set_title(method.replace("_", " "), fontsize=10)
    for ax in (left, right):
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def save_explanations(
    model: VisionTransformer,
    batch: torch.Tensor,
    records: list[dict],
    targets: dict[Path, Path],
    paths: Sequence[Path],
    method: str,
) -> None:
    """Explain the batch's predicted classes with `method` and write one PNG per image (a
    headless model's records have no label: the title is the file name)."""
    maps = METHODS[method](model, batch).detach().cpu()  # (B, gh, gw)
    pixels = denormalize(batch.cpu(), model.preprocess.mean, model.preprocess.std)  # (B, H, W, 3)
    for path, record, image, heatmap in zip(paths, records, pixels, maps, strict=True):
        if "label" in record:
            title = f"{record['label']} ({record['probability']:.1%})"
        else:
            title = Path(path).name
        fig = explanation_figure(image, heatmap, title, method)
        save_figure(fig, targets[path], dpi=100)


# -- command line ----------------------------------------------------------------------------------
def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad flags before any work is done (output locations: InputError, one line)."""
    for flag in ("top_k", "batch_size"):
        if getattr(args, flag) < 1:
            parser.error(
                f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}"
            )
    problem = missing_model_argument(args)
    if problem:
        parser.error(problem)
    if args.output is not None:
        if args.output.suffix.lower() not in OUTPUT_SUFFIXES:
            parser.error(f"--output {args.output}: the file name must end in .csv or .json")
        writable_location("--output", args.output, folder=False)
    if args.explain is not None:
        writable_location("--explain", args.explain, folder=True)
    if args.features is not None:
        if args.features.suffix.lower() not in FEATURE_SUFFIXES:
            parser.error(
                f"--features {args.features}: the file name must end in .npz, .csv or .json"
            )
        writable_location("--features", args.features, folder=False)


def check_headless(args: argparse.Namespace, model: VisionTransformer) -> None:
    """A model without a classifier head embeds and explains (rollout) but classifies nothing."""
    if model.num_classes > 0:
        return
    what = "the model has no classifier head (num_classes=0, a feature extractor)"
    if args.features is None and args.explain is None:
        raise InputError(f"{what}: nothing to classify; use --features FILE or --explain DIR")
    if args.output is not None:
        raise InputError(f"--output {args.output}: {what}; use --features FILE for embeddings")
    if args.explain is not None and args.method != "rollout":
        raise InputError(
            f"--method {args.method} explains a class and {what}: use --method rollout "
            "(or vit.explain with direction= to explain a similarity)"
        )


def writable_location(flag: str, path: Path, folder: bool) -> None:
    """Fail now, in one line, if `path` could not be written at the end."""
    problem = unwritable(flag, path, folder)
    if problem:
        raise InputError(problem)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(parser, args)
        device = resolve_device(args.device, DistInfo())
        model = model_from_flags(args).to(device)
        check_headless(args, model)
    except (InputError, ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    top_k = min(args.top_k, model.num_classes)
    paths, problems = expand_image_paths(args.images)
    names = class_names_for(model)
    transform = create_transform(model.preprocess)
    targets = explanation_paths(paths, args.explain) if args.explain else {}
    records: list[dict] = []
    features: list[torch.Tensor] = []  # (B, D) per batch, with --features
    progress = tqdm(
        total=len(paths),
        unit="img",
        file=sys.stderr,
        disable=len(paths) <= args.batch_size or None,  # None: only on a terminal
    )
    for batch_paths, batch, errors in prepared_batches(
        paths, transform, args.batch_size, args.workers
    ):
        problems += errors
        if batch is not None:
            batch = batch.to(device)
            embedding = args.embedding if args.features is not None else None
            logits, batch_features = logits_and_features(model, batch, embedding)
            if args.tta == "flip" and logits is not None:  # add the mirror images' view
                with torch.inference_mode():
                    mirrored = model(batch.flip(-1)).float()  # (B, K)
                    logits = mean_probability(logits.float(), mirrored)
            if logits is None:  # a headless model: paths only
                batch_records = [{"path": str(path)} for path in batch_paths]
            else:
                probs, indices = best_of(logits, top_k)
                batch_records = records_for(batch_paths, probs, indices, names)
            records += batch_records
            if batch_features is not None:
                features.append(batch_features.cpu())
            if args.explain:
                save_explanations(model, batch, batch_records, targets, batch_paths, args.method)
        progress.update(len(batch_paths) + len(errors))
    progress.close()
    return finish(args, records, problems, top_k, features)


def finish(
    args: argparse.Namespace,
    records: list[dict],
    problems: list[str],
    top_k: int,
    features: list[torch.Tensor] | None = None,
) -> int:
    """Print or write the records and features, then the problems; the exit status. With
    nothing classified nothing is written: earlier --output/--features files stay as they were."""
    if not records:
        for flag in ("output", "features"):
            if getattr(args, flag) is not None:
                problems.append(
                    f"no image was read; --{flag} {getattr(args, flag)} was not written"
                )
    if args.features is not None and records:
        embeddings = torch.cat(features)  # (N, D)
        try:
            write_features(args.features, [r["path"] for r in records], embeddings)
        except OSError as e:
            print(f"error: --features {args.features}: cannot write it ({e})", file=sys.stderr)
            return 2
        print(
            f"wrote {len(records)} embeddings ({embeddings.shape[1]} values each, "
            f"{EMBEDDINGS[args.embedding]}) to {args.features}",
            file=sys.stderr,
        )
    if args.output is not None and records:
        try:
            write_records(args.output, records, top_k)
        except OSError as e:
            print(f"error: --output {args.output}: cannot write it ({e})", file=sys.stderr)
            return 2
        print(f"wrote {len(records)} predictions to {args.output}", file=sys.stderr)
    elif top_k > 0:  # a headless model (top_k 0) classifies nothing: nothing to print
        print_records(records, top_k)
    if args.explain and records:
        print(f"wrote {len(records)} attention maps to {args.explain}", file=sys.stderr)
    for message in problems:
        print(f"error: {message}", file=sys.stderr)
    return 1 if problems or not records else 0


if __name__ == "__main__":
    sys.exit(main())
