"""Hand a model on, verified: ONNX, a transformers folder, a torchvision state dict.

    python -m vit.export CHECKPOINT [--model NAME] [--pretrained [PATH]] [--onnx FILE
        [--static-size] [--optimize] [--int8 [--calibration DATA [--data-root DIR]]]] [--hf DIR]
        [--torchvision FILE] [--overwrite]

CHECKPOINT is read as `python -m vit.evaluate` and `vit.predict` read their --checkpoint
(`vit.resolve_model`): a vit.train run folder or a weights file in it, one of our
`.safetensors` files, a transformers folder, a weights file of another layout with --model
NAME, or a model name with --pretrained (timm's weights) or --pretrained PATH.
Every requested output is checked as possible before any is written (its location, the
optional package it needs, whether the format can hold this model); then each export is checked
before it is put in place: the written file is loaded by the library it is meant for
(onnxruntime, transformers `from_pretrained`, `torchvision.models.vit_*`), run on the same
random images as our model, and its logits must agree with ours to `--tolerance`
(max |theirs - ours| / max |ours|). A failed export leaves no file behind.
An output that exists (a file, or a --hf folder with anything in it) is replaced only with
--overwrite (the folder whole); the weights being exported never are.
The ONNX graph takes any batch and any height and width that are multiples of the patch size
(the position embeddings are resampled inside it; --static-size fixes the model's size);
--optimize applies onnxruntime's transformer fusions and reports their counts; --int8 stores
int8 matrix products (checked to --int8-tolerance, as int8 cannot meet 1e-5), their activations
quantized at run time, or with --calibration DATA at ranges measured once on images of DATA's
train split (static int8, which OpenVINO runs too; CIFAR read from --data-root, downloaded there
when missing, as vit.evaluate reads --data). Which path is fastest on this CPU:
`python -m vit.benchmark CHECKPOINT`. See docs/fast-inference.md.

onnx, onnxruntime, onnxscript and transformers are optional: `pip install
'vit-from-scratch[interop]'`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli.flags import (
    add_data_root_argument,
    add_model_arguments,
    command_name,
    module_parser,
    number_in,
    runs_as_command,
)
from .utils.ranges import AT_LEAST_1, NON_NEGATIVE

FORMATS = ("onnx", "hf", "torchvision")  # the export flags, in the order they are written


def build_parser() -> argparse.ArgumentParser:
    # a bad flag: one line, not the usage text
    parser = module_parser(command_name(__name__, "vit.export"), __doc__)
    add_model_arguments(parser, positional=True)
    parser.add_argument(
        "--onnx", type=Path, metavar="FILE", help="ONNX model, dynamic batch, height and width"
    )
    parser.add_argument(
        "--static-size", action="store_true", help="ONNX: fix height and width to the model's"
    )
    parser.add_argument(
        "--optimize", action="store_true", help="ONNX: onnxruntime's transformer fusions"
    )
    parser.add_argument(
        "--int8", action="store_true", help="ONNX: int8 matrix products (dynamic quantization)"
    )
    parser.add_argument(
        "--calibration",
        metavar="DATA",
        help="--int8: static activation ranges measured on images of DATA's train split "
        "(cifar10, cifar100 or a folder with train/<class>/<images>)",
    )
    parser.add_argument(
        "--calibration-images",
        type=number_in(AT_LEAST_1),
        default=256,
        metavar="N",
        help="--calibration: how many images, spread over the classes (default: %(default)s)",
    )
    add_data_root_argument(parser, data_flag="--calibration")
    parser.add_argument(
        "--int8-tolerance",
        type=number_in(NON_NEGATIVE),
        default=0.1,
        help="--int8: max relative logit difference to float32 (default 0.1)",
    )
    parser.add_argument("--hf", type=Path, metavar="DIR", help="transformers folder")
    parser.add_argument("--torchvision", type=Path, metavar="FILE", help="torchvision state dict")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output (--hf: the whole folder); refused otherwise, and "
        "the exported weights themselves never",
    )
    parser.add_argument(
        "--tolerance", type=number_in(NON_NEGATIVE), default=1e-5, help="max relative logit diff"
    )
    return parser


if runs_as_command(__name__, "vit.export"):
    # `python -m vit.export` or `vit-export`: --help and flag mistakes are answered before the
    # imports below load torch (seconds); main() reads the flags again, at no cost.
    build_parser().parse_args()

# ruff: noqa: E402  (the imports below come after the early answer above, on purpose)
import contextlib
import functools

from .cli.flags import (
    DATA_ROOT,
    interrupt_status,
    kept_output,
    replaced_input,
    sigterm_as_ctrl_c,
    stopped_how,
    unwritable,
)
from .cli.model_argument import model_from_flags
from .factory.timm_weights import TIMM_WEIGHTS
from .interop.export_check import MissingExtraError, require
from .interop.layouts import huggingface
from .interop.layouts import torchvision as torchvision_layout
from .interop.onnx_export import OnnxOptions, export_onnx, require_onnx_packages
from .interop.torchvision_export import export_torchvision
from .interop.transformers_export import FOLDER_FILES, export_transformers
from .models.class_names import class_names_for
from .models.registry import model_preprocess
from .models.vision_transformer import VisionTransformer
from .utils import locks
from .utils.locks import LOCK_NAME

# -- command line --------------------------------------------------------------------------------
SUFFIXES = {"onnx": (".onnx",), "torchvision": (".pth", ".pt")}  # how the commands read them


def location_problems(args: argparse.Namespace, targets: list[tuple[str, Path]]) -> list[str]:
    """Why an output could not or may not be written at the end (a folder where a file goes,
    no write permission, one path named twice, a file or folder the user has and --overwrite
    not given, the weights being exported), found before anything is loaded or written."""
    given = (args.checkpoint, None if args.pretrained == TIMM_WEIGHTS else args.pretrained)
    inputs = [Path(p) for p in given if p is not None and Path(p).exists()]
    problems = []
    seen: dict[Path, str] = {}
    for flag, path in targets:
        key = path.resolve()
        if key in seen:
            problems.append(f"--{flag} {path}: --{seen[key]} writes there too; give two paths")
        seen[key] = flag
    for flag, path in targets:
        problems.append(unwritable(f"--{flag}", path, flag == "hf"))
        problems.append(replaced_input(f"--{flag}", path, inputs))
        others = flag == "hf" and not_an_export(path)  # before "add --overwrite": it would not do
        problems.append(others or kept_output(f"--{flag}", path, args.overwrite))
        if flag in SUFFIXES and path.suffix.lower() not in SUFFIXES[flag]:
            problems.append(
                f"--{flag} {path}: the file name must end in {' or '.join(SUFFIXES[flag])} "
                f"(how vit.evaluate, vit.predict and vit.load_weights recognise it)"
            )
    if args.hf is not None:  # the folder is put in place whole, after the files before it
        problems += [
            f"--{flag} {path}: inside --hf {args.hf}, which is written as a whole folder; "
            f"choose a path outside it"
            for flag, path in targets
            if flag != "hf" and args.hf.resolve() in path.resolve().parents
        ]
    return [problem for problem in problems if problem]


def not_an_export(folder: Path) -> str | None:
    """Why --hf `folder`, which an export replaces whole, may not be (it holds files an export
    does not write: a user's, the --calibration images, the folder the command runs in); None
    where it holds nothing else."""
    if not folder.is_dir():
        return None
    others = sorted(p.name for p in folder.iterdir() if p.name not in (*FOLDER_FILES, LOCK_NAME))
    if not others:
        return None
    return (
        f"--hf {folder}: holds files an export does not write ({', '.join(others[:3])}"
        f"{', ...' if len(others) > 3 else ''}), which replacing the folder would delete; "
        f"choose another folder, or remove them"
    )


def weights_only_note(model: VisionTransformer) -> str:
    """What a torchvision file leaves out, and the preprocessing its users must apply."""
    pre = model_preprocess(model)
    mean, std = (", ".join(f"{v:g}" for v in values) for values in (pre.mean, pre.std))
    return (
        f"the file holds the weights alone (no class names, no preprocessing; read back, "
        f"torchvision's ImageNet preprocessing is assumed): prepare images as this model "
        f"was, {pre.interpolation} resize and crop to {pre.input_size[0]}x{pre.input_size[1]} "
        f"(crop_pct {pre.crop_pct:g}), mean ({mean}), std ({std})"
    )


def format_problem(flag: str, model: VisionTransformer) -> str | None:
    """Why the format of --`flag` cannot be made for this model (the optional package it needs
    is missing, or the format cannot hold the model), None if it can."""
    try:
        if flag == "onnx":
            require_onnx_packages()
        elif flag == "hf":
            require("transformers", "--hf (verifying the export)")
            huggingface.config_to_hf(model.config, class_names_for(model), model.model_name)
            # the weights too: what the class has no tensor for (a CLIP projection's bias)
            huggingface.state_to_hf(model.state_dict(), model.config, model.model_name)
        else:
            torchvision_layout.constructor_args(model.config)
    except (MissingExtraError, ValueError) as e:
        return str(e)
    return None


def calibration_images(args: argparse.Namespace, model: VisionTransformer):
    """--calibration's images (N, C, H, W), prepared as the model's evaluation is; None
    without the flag."""
    if args.calibration is None:
        return None
    if model.preprocess is None:
        raise ValueError("the model does not say how its input is prepared (no preprocess)")
    from .data.transforms import evaluation_images  # albumentations with it: ~1 s, only here

    return evaluation_images(
        args.calibration,
        "train",
        args.calibration_images,
        model.preprocess,
        data_root=args.data_root,
        download=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    onnx_only = [flag for flag in ("static_size", "optimize", "int8") if getattr(args, flag)]
    if onnx_only and args.onnx is None:
        flag = "--" + onnx_only[0].replace("_", "-")
        parser.error(f"{flag} shapes the ONNX export: pass --onnx FILE too; nothing was written")
    if args.calibration is not None and not args.int8:
        parser.error("--calibration calibrates --int8's activations: pass --int8 too")
    if args.data_root != DATA_ROOT and args.calibration is None:
        parser.error("--data-root is where --calibration cifar10/cifar100 is read: pass it too")
    targets = [(flag, getattr(args, flag)) for flag in FORMATS if getattr(args, flag) is not None]
    if not targets:
        parser.error("nothing to do: pass --onnx FILE, --hf DIR and/or --torchvision FILE")
    for problem in location_problems(args, targets):
        parser.error(problem)
    with contextlib.ExitStack() as held:
        for flag, path in targets:  # one writer per output: another export of it is refused
            try:
                held.enter_context(locks.hold(path, folder=False))
            except locks.LockError as e:
                print(f"error: --{flag} {e}; nothing was written", file=sys.stderr)
                return 2
        return export_targets(parser, args, targets)


def export_targets(
    parser: argparse.ArgumentParser, args: argparse.Namespace, targets: list[tuple[str, Path]]
) -> int:
    """Load the model, check every target's format, then write each one: the exit status."""
    try:
        model = model_from_flags(args, source="CHECKPOINT")
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Every output is checked as possible before the first is written: no half-done export.
    refused = [(flag, path, format_problem(flag, model)) for flag, path in targets]
    refused = [(flag, path, problem) for flag, path, problem in refused if problem]
    for flag, path, problem in refused:
        other = "" if flag == "onnx" else " (--onnx FILE holds every model)"
        print(f"error: --{flag} {path}: {problem}; nothing was written{other}", file=sys.stderr)
    if refused:
        return 2
    try:
        calibration = calibration_images(args, model)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: --calibration {args.calibration}: {e}; nothing was written", file=sys.stderr)
        return 2
    options = OnnxOptions(
        dynamic_size=not args.static_size,
        optimize=args.optimize,
        int8=args.int8,
        int8_tolerance=args.int8_tolerance,
        calibration=calibration,
    )
    exporters = {
        "onnx": functools.partial(export_onnx, options=options),
        "hf": export_transformers,
        "torchvision": export_torchvision,
    }
    failed, written = 0, []
    try:
        with sigterm_as_ctrl_c():
            for flag, path in targets:
                try:
                    print(f"--{flag}: {exporters[flag](model, path, tolerance=args.tolerance)}")
                    written.append(str(path))
                    if flag == "torchvision":
                        print(f"--torchvision: {weights_only_note(model)}")
                except (MissingExtraError, ValueError, OSError) as e:
                    print(f"error: --{flag} {path}: {e}", file=sys.stderr)
                    failed += 1
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the file being written is not there
        kept = f"{', '.join(written)} written; " if written else ""
        print(f"{parser.prog}: {stopped_how(e)}; {kept}nothing else was written", file=sys.stderr)
        return interrupt_status(e)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
