"""Which way of running a model is fastest on this CPU, measured on it (a minute or a few).

    python -m vit.benchmark CHECKPOINT [--model NAME] [--pretrained [PATH]] [--data DATA]
        [--data-root DIR] [--batch-size 32] [--threads N] [--onnx-dir DIR]

CHECKPOINT is read as `python -m vit.evaluate` reads --checkpoint (a run folder, a weights file, a
transformers folder, a model name with --pretrained). The paths are timed side by side on one
batch, taking turns round by round: the PyTorch model in float32 and with bfloat16 weights
(--model-dtype bfloat16, where the CPU multiplies bfloat16 natively), its ONNX export in
onnxruntime (float32, int8, and static int8 calibrated on DATA's train images), and in OpenVINO
where it is installed (float32, bfloat16, static int8). Each path's outputs are compared with
PyTorch float32's on the same images (DATA's test images, else random ones): a classifier's by
the share of top-1 classes that agree, a headless model's embeddings by their least cosine
similarity. The fastest path is printed with the commands that make and run it, with the model
arguments given here. Its accuracy on a whole test set is vit.evaluate's to tell (a headless
model's: --knn on its features): the command is printed too. See docs/fast-inference.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .cli.flags import (
    DATA_ROOT,
    add_data_root_argument,
    add_model_arguments,
    add_threads_argument,
    command_name,
    module_parser,
    number_in,
    runs_as_command,
    unwritable,
)
from .factory.timm_weights import TIMM_WEIGHTS
from .utils.ranges import AT_LEAST_1, POSITIVE


def build_parser() -> argparse.ArgumentParser:
    # a bad flag: one line, not the usage text
    parser = module_parser(command_name(__name__, "vit.benchmark"), __doc__)
    add_model_arguments(parser, positional=True)
    parser.add_argument(
        "--data",
        metavar="DATA",
        help="cifar10, cifar100 (in --data-root; a folder of that name: ./cifar10) or a folder "
        "with train/ and test/: the batch is its test images and static int8 is calibrated on "
        "its train images (default: random images, no static int8)",
    )
    add_data_root_argument(parser)
    parser.add_argument(
        "--batch-size", type=number_in(AT_LEAST_1), default=32, help="(default: %(default)s)"
    )
    add_threads_argument(parser)
    parser.add_argument(
        "--calibration-images",
        type=number_in(AT_LEAST_1),
        default=64,
        metavar="N",
        help="--data: train images that calibrate static int8 (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=number_in(AT_LEAST_1), default=3, help="(default: %(default)s)"
    )
    parser.add_argument(
        "--round-seconds",
        type=number_in(POSITIVE),
        default=1.0,
        help="about how long each path runs in a round (default: %(default)s)",
    )
    parser.add_argument(
        "--onnx-dir",
        type=Path,
        metavar="DIR",
        help="keep the ONNX files there (default: a temporary folder, removed at the end)",
    )
    return parser


if runs_as_command(__name__, "vit.benchmark"):
    # `python -m vit.benchmark` or `vit-benchmark`: --help and flag mistakes are answered before
    # the imports below load torch (seconds); main() reads the flags again, at no cost.
    build_parser().parse_args()

# ruff: noqa: E402  (the imports below come after the early answer above, on purpose)
import statistics
import tempfile

import torch

from .cli.flags import use_threads
from .cli.model_argument import model_from_flags
from .data.transforms import evaluation_images
from .inference.cpu_paths import (
    ONNX_FILES,
    InferencePath,
    agreement,
    cpu_flags,
    cpu_name,
    cpu_paths,
    time_rounds,
    unsteady,
)
from .inference.precision import fast_bfloat16


def onnx_dir_problem(folder: Path | None) -> str | None:
    """Why --onnx-dir cannot take the files: it cannot be written, or one of them is there
    already (never overwritten)."""
    if folder is None:
        return None
    problem = unwritable("--onnx-dir", folder, folder=True)  # a file, or no write permission
    if problem:
        return problem
    taken = [name for name, _ in ONNX_FILES.values() if (folder / name).exists()]
    if taken:
        return f"--onnx-dir {folder}: {taken[0]} is there already; name an empty or new folder"
    return None


def print_table(
    paths: list[InferencePath], speed: dict, agreements: dict, shown: str, classifier: bool
) -> None:
    """`agreements`: label -> `agreement` (a headless model's: the least cosine similarity)."""
    base = speed["PyTorch float32"]
    header = ("images/s", "x float32", "top-1 same" if classifier else "min cosine", "max rel diff")
    print(f"\n{'path':26s} {header[0]:>9s} {header[1]:>9s} {header[2]:>10s} {header[3]:>12s}")
    for path in paths:
        if path.run is None:
            continue
        difference, score = agreements[path.label]
        score_text = f"{100 * score:9.1f}%" if classifier else f"{score:10.5f}"
        print(
            f"{path.label:26s} {speed[path.label]:9.1f} {speed[path.label] / base:9.2f} "
            f"{score_text} {difference:12.1e}"
        )
    if classifier:
        print(f"(top-1 same and max rel diff: against PyTorch float32 on the {shown})")
    else:
        print(
            f"(min cosine of an image's embedding and max rel diff: against PyTorch float32 "
            f"on the {shown})"
        )
    print("(max rel diff: max |output - PyTorch float32's| / max |PyTorch float32's| on them)")
    for path in paths:
        if path.skipped:
            print(f"not timed: {path.label}: {path.skipped}")


def model_arguments(args: argparse.Namespace, source_flag: str = "--checkpoint") -> list[str]:
    """The model arguments given to the benchmark, as another command takes them: CHECKPOINT
    after `source_flag` (vit.evaluate's and vit.predict's --checkpoint; "" for vit.export's
    positional), then --model and --pretrained [PATH], without which a state dict or a model
    name is refused."""
    words = [source_flag, args.checkpoint] if source_flag else [args.checkpoint]
    if args.model is not None:
        words += ["--model", args.model]
    if args.pretrained == TIMM_WEIGHTS:  # given bare; in every printed command a flag follows
        words.append("--pretrained")
    elif args.pretrained is not None:
        words += ["--pretrained", args.pretrained]
    return words


def command(program: str, *words: str) -> str:
    """A printed command line, its words quoted for the shell where they need it."""
    return f"  {program} {shlex.join(words)}"


def advice(
    best: InferencePath, ratio: float, args: argparse.Namespace, classifier: bool = True
) -> str:
    """The fastest path and the commands that make and run it; `classifier` False (a headless
    model): its features are scored (--knn) and written (--features), as it classifies nothing."""
    data = args.data or "DATA"
    data_root = ["--data-root", args.data_root] if args.data_root != DATA_ROOT else []
    lines = [f"\nfastest here: {best.label}, {ratio:.2f}x PyTorch float32"]
    run = best.flags.split()
    if best.export is None:  # the PyTorch model itself, from the arguments given here
        run = model_arguments(args) + run
    else:  # an exported file, which names its model alone
        export = [data if word == "DATA" else word for word in best.export.split()]
        if "--calibration" in export:  # its images are read as --data is here
            export += data_root
        lines.append(command("python -m vit.export", *model_arguments(args, ""), *export))
    data_flags = ["--data", data, *data_root]
    if classifier:
        lines.append(command("python -m vit.evaluate", *run, *data_flags) + "  # its accuracy")
        lines.append(command("python -m vit.predict IMAGES", *run))
    else:
        evaluate = command("python -m vit.evaluate", *run, *data_flags, "--knn")
        lines.append(evaluate + "  # its features' kNN accuracy")
        lines.append(command("python -m vit.predict IMAGES", *run, "--features", "embeddings.npz"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = onnx_dir_problem(args.onnx_dir)
    if problem:
        parser.error(problem)
    use_threads(args.threads)
    try:
        model = model_from_flags(args, source="CHECKPOINT").float().eval()
        if args.data is not None:
            preprocess = model.preprocess
            # as vit.evaluate reads --data: CIFAR from --data-root, downloaded there when missing
            read = {"data_root": args.data_root, "download": True}
            batch = evaluation_images(args.data, "test", args.batch_size, preprocess, **read)
            calibration = evaluation_images(
                args.data, "train", args.calibration_images, preprocess, **read
            )
            shown = f"{len(batch)} test images of {args.data}"
        else:
            channels, (height, width) = model.config.in_chans, model.preprocess.input_size
            generator = torch.Generator().manual_seed(0)
            batch = torch.randn(args.batch_size, channels, height, width, generator=generator)
            calibration, shown = None, f"{len(batch)} random images"
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    native = "native" if fast_bfloat16(torch.device("cpu")) else "emulated"
    print(f"CPU: {cpu_name()}; {cpu_flags()}; bfloat16 {native}; {torch.get_num_threads()} threads")
    name = model.model_name or args.checkpoint
    print(f"model: {name}, input {tuple(batch.shape[1:])}, batch {len(batch)}")
    print("exporting (each file checked against the model):")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.onnx_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = cpu_paths(model, folder, calibration)
        run = {path.label: path.run for path in paths if path.run is not None}
        pixels = batch.numpy()
        reference = run["PyTorch float32"](pixels)
        classifier = model.num_classes > 0  # else the outputs are embeddings
        agreements = {
            label: agreement(reference, fn(pixels), classifier) for label, fn in run.items()
        }
        timed = time_rounds(run, pixels, args.rounds, args.round_seconds)
    speed = {label: statistics.median(speeds) for label, speeds in timed.items()}
    print_table(paths, speed, agreements, shown, classifier)
    if noisy := unsteady(timed):
        print(
            f"warning: {noisy[0]}'s rounds differed {noisy[1]:.1f}x (fastest / slowest): the "
            f"machine's load or clock changed while timing, so this ranking may not hold; run "
            f"again on an idle machine, or with more --rounds"
        )
    best = max((p for p in paths if p.run is not None), key=lambda p: speed[p.label])
    print(advice(best, speed[best.label] / speed["PyTorch float32"], args, classifier))
    if args.onnx_dir is not None:
        print(f"the ONNX files are in {args.onnx_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
