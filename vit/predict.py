"""Classify, embed and explain images from the command line: files, folders and glob patterns.

    python -m vit.predict IMAGE|FOLDER|GLOB ... (--checkpoint SRC [--model NAME] | --model NAME)
        [--pretrained [PATH]] [--top-k 5] [--batch-size 32] [--device auto]
        [--output preds.csv|preds.json] [--overwrite]
        [--explain DIR [--method rollout|gradient_rollout|relevance|last_block]]
        [--features FILE.npz|.csv|.json [--embedding pooled|clstoken|...] [--shard-size N]]

The model argument is read as by evaluate.py and `vit.export` (`vit.factory.resolve_model`):
--checkpoint is a train.py run folder (its model.safetensors) or a weights file in it, one of
our `.safetensors` files, a transformers folder (their architecture and class names are
stored), a weights file of another layout (timm, torchvision, transformers state dicts, Google
.npz) with --model NAME, or a model name with --pretrained (timm's weights) or --pretrained
PATH. --model NAME alone means timm's pretrained weights for that name (downloaded once). An
ONNX file exported by `vit.export` is run in onnxruntime (`vit.onnx_model`), with the same
classes, probabilities and --output files; --explain needs the PyTorch model, and --features
the file of a headless model (its output, the pooled embedding).

Images are prepared exactly as `evaluate.py` prepares them (the model's resize, centre crop and
normalisation), so the top-1 class here is evaluate's, under the class names evaluate
reports (`vit.factory.class_names_for`). Without --output the top-k classes are printed per
image; with it, one record per image is written as it goes (CSV or JSON: path, label,
probability, label_2, probability_2, ...), then put in place at the end. A file that cannot be
read is named on stderr, the other images are still classified, and the exit status is 1 at
the end. An existing --output or --features file is replaced only with --overwrite.

--features FILE writes one embedding per image with its path, through the embedding engine
`vit.features` (docs/embeddings.md): memory flat in the number of images, work saved in shards
of --shard-size images as it goes (the same command run again after a kill continues from the
last complete shard), unreadable images listed in FILE.errors.txt, and under torchrun
(`torchrun --nproc_per_node M -m vit.predict ...`) the images split between the processes into
one file. --embedding: pooled (default; the pre-logits features, what a headless backbone such
as DINOv2 returns as `model(x)`), clstoken, clstoken_avgpool, lastN_clstoken (e.g.
last4_clstoken), image_embeds (a CLIP tower's projection) or output (the model's output).
FILE.npz holds two arrays, `paths` (N,) and `features` (N, D) float32 (`np.load(FILE)`, no
pickle; the format for large jobs); FILE.csv one row per image, `path, f0, ..., f{D-1}`;
FILE.json a list of {"path", "embedding"}. With a classifier, the classes are computed in a
second pass. A model without a classifier head (num_classes=0) classifies nothing: it takes
--features and --explain (last_block by default, or rollout) only. Nothing is written when no
image could be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import (
    TTA_CHOICES,
    ArgumentParser,
    add_model_arguments,
    add_model_dtype_argument,
    add_threads_argument,
)

METHOD_NAMES = ("gradient_rollout", "last_block", "relevance", "rollout")  # --method
OUTPUT_SUFFIXES = (".csv", ".json")
FEATURE_SUFFIXES = (".npz", ".csv", ".json")
# vit.features.DEFAULT_SHARD_IMAGES, not imported here: --help answers before torch is loaded
DEFAULT_SHARD_IMAGES = 2048
EMBEDDING_HELP = (
    "for --features: pooled (default: the pre-logits features, timm's; DINOv2's pooler "
    "output), clstoken (DINOv2's x_norm_clstoken), clstoken_avgpool (DINOv2's linear protocol: "
    "class token + mean patch token, 2D values), last4_clstoken or any lastN_clstoken (DINO's "
    "n_last_blocks: the last N blocks' class tokens, N*D values), image_embeds (a CLIP tower's "
    "projection into the text space), output (the model's output)"
)
METHOD_HELP = (
    "map for --explain: rollout (a classifier's default), gradient_rollout and relevance "
    "(explain the predicted class), last_block (a headless backbone's default: the DINO "
    "picture, one map per head of the last block, registers left out). Rollout on a DINOv2 "
    "model without registers lights a few high-norm artifact patches, a property of the model "
    "(Darcet et al. 2024, 'Vision Transformers Need Registers'); last_block shows the heads"
)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(  # a bad flag: one line, not the usage text
        prog="python -m vit.predict",
        description="Top-k classes, embeddings (--features) or attention maps (--explain) for "
        "each image.",
    )
    parser.add_argument(
        "images", nargs="+", help="image files, folders (searched recursively) or glob patterns"
    )
    add_model_arguments(parser)
    parser.add_argument("--top-k", type=int, default=5, help="classes per image (default 5)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    parser.add_argument("--workers", type=int, default=4, help="threads decoding images")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda:0")
    add_threads_argument(parser)
    add_model_dtype_argument(parser)
    parser.add_argument("--output", type=Path, help="write the predictions to FILE.csv or .json")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output or --features file (refused otherwise)",
    )
    parser.add_argument("--explain", type=Path, metavar="DIR", help="one attention PNG per image")
    parser.add_argument("--method", choices=sorted(METHOD_NAMES), help=METHOD_HELP)
    parser.add_argument(
        "--tta",
        choices=TTA_CHOICES,
        default="none",
        help="test-time augmentation: classify by the mean probability of views of each image: "
        "flip (with its mirror image, 2x the compute), shift (moved 1/16 of its side four ways, "
        "5x), flip-shift (both, 10x)",
    )
    parser.add_argument(
        "--features",
        type=Path,
        metavar="FILE",
        help="write one embedding per image with its path: FILE.npz (arrays paths, features; "
        "use it for large jobs), .csv (path, f0, f1, ...) or .json; resumable after a kill, "
        "split between processes under torchrun",
    )
    parser.add_argument("--embedding", default="pooled", metavar="NAME", help=EMBEDDING_HELP)
    parser.add_argument(
        "--shard-size",
        type=int,
        default=DEFAULT_SHARD_IMAGES,
        metavar="N",
        help="for --features: images per shard of saved work (default "
        f"{DEFAULT_SHARD_IMAGES}); a rerun after a kill continues from the last complete shard",
    )
    return parser


if __name__ == "__main__":
    # `python -m vit.predict`: --help and flag mistakes are answered before the imports below
    # load torch and matplotlib (seconds); main() reads the flags again, at no cost.
    build_parser().parse_args()

# ruff: noqa: E402  (the imports below come after the early answer above, on purpose)
import csv
import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TextIO

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image
from tqdm import tqdm

from . import explain
from .cli import missing_model_argument, unwritable, use_threads
from .distributed import DistInfo, cleanup, from_env, resolve_device, setup
from .factory import class_names_for, create_transform, model_from_flags
from .families import family_of
from .features import FeaturesError, check_embedding, describe, extract_features
from .images import CorruptImageError, expand_image_paths, open_image
from .io import atomic_write
from .model import VisionTransformer
from .onnx_model import onnx_device, refuse_flags
from .plots import add_colorbar, denormalize, draw_overlay, plot_head_attention, save_figure
from .precision import cast_for_inference
from .tta import black_pixel, tta_logits

METHODS: dict[str, Callable[[VisionTransformer, torch.Tensor], torch.Tensor]] = {
    "rollout": explain.attention_rollout,
    "gradient_rollout": explain.gradient_rollout,
    "relevance": explain.relevance,
}
HEAD_MAP_CMAP = "inferno"  # plot_head_attention's colours, for the colour bar


class InputError(Exception):
    """A problem with what the user passed, reported as one line without a traceback."""


class _NothingRead(Exception):
    """No image was read: the --output file being written is dropped, an earlier one kept."""


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


class RecordWriter:
    """Records streamed to an open file as they come: CSV (a header row, one row per image) or
    JSON (a list of objects, as json.dumps(records, indent=2) writes it)."""

    def __init__(self, file: TextIO, top_k: int, as_json: bool) -> None:
        self.file, self.as_json, self.count = file, as_json, 0
        fields = ["path", "label", "probability"]
        fields += [
            f"{name}_{rank}" for rank in range(2, top_k + 1) for name in ("label", "probability")
        ]
        self.csv = None if as_json else csv.DictWriter(file, fieldnames=fields, lineterminator="\n")
        if self.csv is not None:
            self.csv.writeheader()

    def write(self, records: list[dict]) -> None:
        for record in records:
            if self.csv is not None:
                self.csv.writerow(record)
            else:
                indented = json.dumps(record, indent=2).replace("\n", "\n  ")
                self.file.write(("[\n  " if self.count == 0 else ",\n  ") + indented)
            self.count += 1

    def close(self) -> None:
        if self.as_json and self.count:
            self.file.write("\n]\n")


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


def head_maps_figure(image: np.ndarray, head_maps: torch.Tensor, title: str) -> Figure:
    """The DINO picture as notebooks/attention_maps.ipynb draws it: the image, then one map
    (gh, gw) per head of `head_maps` (nh, gh, gw) over it, with a colour bar."""
    fig = plot_head_attention(head_maps, image=image, title=title)
    add_colorbar(fig, cmap=HEAD_MAP_CMAP, label="attention / head max")
    return fig


def save_explanations(
    model: VisionTransformer,
    batch: torch.Tensor,
    records: list[dict],
    targets: dict[Path, Path],
    paths: Sequence[Path],
    method: str,
    weights: str,
) -> None:
    """Explain the batch with `method` (the predicted classes, or the last block's heads) and
    write one PNG per image (a headless model's records have no label: the title is the file
    name); `weights` names where the weights came from, for last_block's title."""
    pixels = denormalize(batch.cpu(), model.preprocess.mean, model.preprocess.std)  # (B, H, W, 3)
    if method == "last_block":
        heads = explain.last_block_attention(model, batch, include_registers=False)
        maps = heads.detach().cpu()  # (B, nh, gh, gw)
    else:
        maps = METHODS[method](model, batch).detach().cpu()  # (B, gh, gw)
    for path, record, image, heatmap in zip(paths, records, pixels, maps, strict=True):
        if "label" in record:
            title = f"{record['label']} ({record['probability']:.1%})"
        else:
            title = Path(path).name
        if method == "last_block":
            reader = "class token" if model.cls_token is not None else "readout"
            title = f"{title}: last block, {reader} to patches, per head. Weights: {weights}"
            fig = head_maps_figure(image, heatmap, title)
        else:
            fig = explanation_figure(image, heatmap, title, method)
        save_figure(fig, targets[path], dpi=100)


def weights_label(args: argparse.Namespace, model: VisionTransformer) -> str:
    """Where the weights came from, for figure titles: the model's name and the checkpoint."""
    source = str(args.checkpoint) if args.checkpoint else None
    if args.pretrained not in (None, False, True):
        source = str(args.pretrained)
    names = [n for n in (model.model_name, source) if n]
    if len(names) == 2 and names[0] != names[1]:
        return f"{names[0]} ({names[1]})"
    return names[0] if names else "unnamed weights"


# -- command line ----------------------------------------------------------------------------------
def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad flags before any work is done (output locations: InputError, one line)."""
    for flag in ("top_k", "batch_size", "shard_size"):
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
    for flag in ("output", "features"):
        path = getattr(args, flag)
        if path is not None and path.is_file() and not args.overwrite:
            raise InputError(
                f"--{flag} {path}: exists; add --overwrite to replace it, or choose another file"
            )


def check_headless(args: argparse.Namespace, model: VisionTransformer) -> None:
    """A model without a classifier head embeds and explains (last_block, rollout) but
    classifies nothing."""
    if model.num_classes > 0:
        return
    what = "the model has no classifier head (num_classes=0, a feature extractor)"
    if args.features is None and args.explain is None:
        raise InputError(f"{what}: nothing to classify; use --features FILE or --explain DIR")
    if args.output is not None:
        raise InputError(f"--output {args.output}: {what}; use --features FILE for embeddings")
    if args.explain is not None and args.method not in (None, "last_block", "rollout"):
        raise InputError(
            f"--method {args.method} explains a class and {what}: use --method last_block (the "
            "default) or rollout (or vit.explain with direction= to explain a similarity)"
        )


def check_distributed(args: argparse.Namespace, info: DistInfo) -> None:
    """Under torchrun the processes split the --features work; nothing else is split."""
    if not info.enabled:
        return
    if args.features is None:
        raise InputError("under torchrun, predict splits --features FILE only; add it")
    for flag in ("output", "explain"):
        if getattr(args, flag) is not None:
            raise InputError(
                f"--{flag}: under torchrun, predict splits --features only; "
                f"run --{flag} in a single process"
            )


def writable_location(flag: str, path: Path, folder: bool) -> None:
    """Fail now, in one line, if `path` could not be written at the end."""
    problem = unwritable(flag, path, folder)
    if problem:
        raise InputError(problem)


def rollout_note(model: VisionTransformer, method: str) -> str | None:
    """The note for rollout on DINOv2 without registers: its few lit patches are the model's."""
    if method == "rollout" and family_of(model).name == "dinov2":
        return (
            "note: rollout on DINOv2 without registers lights a few high-norm artifact patches, "
            "a property of the model (Darcet et al. 2024, 'Vision Transformers Need "
            "Registers'); --method last_block draws the heads"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    info = from_env()
    try:
        check_args(parser, args)
        check_distributed(args, info)
        paths, problems = expand_image_paths(args.images)
        if not paths:  # before the model is loaded: nothing to do
            raise InputError("; ".join(problems))
        use_threads(args.threads)
        device = resolve_device(onnx_device(args), info)
        setup(info, device)  # torchrun: join the others (gloo on CPU); nothing otherwise
        model = model_from_flags(args, onnx=True).to(device)
        given = {
            "--explain": args.explain is not None,
            "--features": args.features is not None,
            "--model-dtype": args.model_dtype != "float32",
        }
        refuse_flags(model, given, args.embedding)
        warning = cast_for_inference(model, args.model_dtype, device)
        if warning and info.is_main:
            print(f"warning: {warning}", file=sys.stderr)
        check_headless(args, model)
        if args.features is not None:
            args.embedding = check_embedding(model, args.embedding)
    except (InputError, ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        code = 0
        if args.features is not None:
            code = embed_images(args, model, paths, device, problems if info.is_main else [])
            problems = []  # said by embed_images
        if code != 2 and not info.enabled and (model.num_classes > 0 or args.explain):
            # with --features, the unreadable images are already said
            quiet = args.features is not None
            code = max(code, classify_images(args, model, paths, device, problems, quiet))
        return code
    finally:
        cleanup()


def embed_images(
    args: argparse.Namespace,
    model: VisionTransformer,
    paths: list[Path],
    device: torch.device,
    problems: list[str],
) -> int:
    """--features through the embedding engine; the lines to say and the exit status."""
    try:
        result = extract_features(
            model,
            [str(p) for p in paths],
            lambda i: open_image(paths[i]),
            args.features,
            embedding=args.embedding,
            batch_size=args.batch_size,
            workers=args.workers,
            device=device,
            shard_images=args.shard_size,
            overwrite=args.overwrite,
        )
    except FeaturesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --features {args.features}: cannot write it ({e})", file=sys.stderr)
        return 2
    if not from_env().is_main:
        return 0
    if result.path is not None:
        resumed = f"; {result.resumed_shards} shards from an earlier run" * bool(
            result.resumed_shards
        )
        print(
            f"wrote {result.count} embeddings ({result.dim} values each, "
            f"{describe(args.embedding)}) to {args.features}{resumed}",
            file=sys.stderr,
        )
    else:
        problems.append(f"no image was read; --features {args.features} was not written")
    problems = [reason for _, reason in result.errors[:5]] + problems
    if len(result.errors) > 5:
        problems.append(f"{len(result.errors) - 5} more unreadable images")
    if result.errors_path is not None:
        problems.append(f"{len(result.errors)} unreadable images listed in {result.errors_path}")
    for message in problems:
        print(f"error: {message}", file=sys.stderr)
    return 1 if problems else 0


def classify_images(
    args: argparse.Namespace,
    model: VisionTransformer,
    paths: list[Path],
    device: torch.device,
    problems: list[str],
    quiet: bool = False,
) -> int:
    """Classes (printed, or streamed to --output) and --explain maps; the exit status. quiet:
    the unreadable images are not said again (--features said them)."""
    top_k = min(args.top_k, model.num_classes)
    method = args.method or ("rollout" if model.num_classes > 0 else "last_block")
    note = rollout_note(model, method) if args.explain else None
    if note:
        print(note, file=sys.stderr)

    unreadable: list[str] = []

    def run(sink: Callable[[list[dict]], None]) -> int:
        return classify_batches(args, model, paths, device, unreadable, top_k, method, sink)

    if args.output is None:
        count = run(lambda records: print_records(records, top_k))
    else:
        count = 0

        def write(tmp: Path) -> None:
            nonlocal count
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = RecordWriter(f, top_k, as_json=args.output.suffix.lower() == ".json")
                count = run(writer.write)
                writer.close()
            if count == 0:
                raise _NothingRead

        try:
            atomic_write(args.output, write)
            print(f"wrote {count} predictions to {args.output}", file=sys.stderr)
        except _NothingRead:
            problems.append(f"no image was read; --output {args.output} was not written")
        except OSError as e:
            print(f"error: --output {args.output}: cannot write it ({e})", file=sys.stderr)
            return 2
    if args.explain and count:
        print(f"wrote {count} attention maps to {args.explain}", file=sys.stderr)
    problems = problems + ([] if quiet else unreadable)
    for message in problems:
        print(f"error: {message}", file=sys.stderr)
    return 1 if problems or not count else 0


def classify_batches(
    args: argparse.Namespace,
    model: VisionTransformer,
    paths: list[Path],
    device: torch.device,
    unreadable: list[str],
    top_k: int,
    method: str,
    sink: Callable[[list[dict]], None],
) -> int:
    """Classify (and explain) batch by batch, handing each batch's records to `sink` (nothing
    kept); unreadable images are added to `unreadable`. Returns the number of images read."""
    names = class_names_for(model)
    transform = create_transform(model.preprocess)
    targets = explanation_paths(paths, args.explain) if args.explain else {}
    weights = weights_label(args, model) if args.explain else ""
    black = black_pixel(model.preprocess).to(device)  # --tta shift's border, normalised
    count = 0
    progress = tqdm(
        total=len(paths),
        unit="img",
        file=sys.stderr,
        disable=len(paths) <= args.batch_size or None,  # None: only on a terminal
    )
    for batch_paths, batch, errors in prepared_batches(
        paths, transform, args.batch_size, args.workers
    ):
        unreadable += errors
        if batch is not None:
            batch = batch.to(device)
            if model.num_classes > 0:
                with torch.inference_mode():
                    _, logits = tta_logits(model.eval(), batch, args.tta, black)  # (B, K)
                probs, indices = best_of(logits, top_k)
                batch_records = records_for(batch_paths, probs, indices, names)
            else:  # a headless model: paths only
                batch_records = [{"path": str(path)} for path in batch_paths]
            if model.num_classes > 0:
                sink(batch_records)
            if args.explain:
                save_explanations(
                    model, batch, batch_records, targets, batch_paths, method, weights
                )
            count += len(batch_paths)
        progress.update(len(batch_paths) + len(errors))
    progress.close()
    return count


if __name__ == "__main__":
    sys.exit(main())
