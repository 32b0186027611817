"""Classify, embed and explain images from the command line: files, folders and glob patterns.

    python -m vit.predict IMAGE|FOLDER|GLOB ... (--checkpoint SRC [--model NAME] | --model NAME)
        [--pretrained [PATH]] [--top-k 5] [--batch-size 32] [--device auto]
        [--output preds.csv|preds.json] [--overwrite]
        [--explain DIR [--method rollout|gradient_rollout|relevance|last_block]]
        [--features FILE.npz|.csv|.json [--embedding pooled|clstoken|...] [--shard-size N]]

The model argument is read as by `vit.evaluate` and `vit.export` (`vit.resolve_model`):
--checkpoint is a vit.train run folder (its model.safetensors) or a weights file in it, one of
our `.safetensors` files, a transformers folder (their architecture and class names are
stored), a weights file of another layout (timm, torchvision, transformers state dicts, Google
.npz) with --model NAME, or a model name with --pretrained (timm's weights) or --pretrained
PATH. --model NAME alone means timm's pretrained weights for that name (downloaded once). An
ONNX file exported by `vit.export` is run in onnxruntime (`vit.interop.onnx_runtime`), with the same
classes, probabilities and --output files; --explain needs the PyTorch model, and --features
the file of a headless model (its output, the pooled embedding).

Images are prepared exactly as `vit.evaluate` prepares them (the model's resize, centre crop and
normalisation), so the top-1 class here is evaluate's, under the class names evaluate
reports (`vit.models.class_names.class_names_for`). Without --output the top-k classes are
printed per image; with it, one record per image is written as it goes (CSV or JSON: path, label,
probability, label_2, probability_2, ...), then put in place at the end. A file that cannot be
read is named on stderr, the other images are still classified, and the exit status is 1 at
the end. An existing --output or --features file, or a map --explain wrote before, is replaced
only with --overwrite; an image being read is never replaced.

--features FILE writes one embedding per image with its path, through the embedding engine
`vit.inference.embed` (docs/embeddings.md): memory flat in the number of images, work saved in
shards of --shard-size images as it goes (the same command run again after a kill continues from the
last complete shard), unreadable images listed in FILE.errors.txt, and under torchrun
(`torchrun --nproc_per_node M -m vit.predict ...`) the images split between the processes into
one file. --embedding: pooled (default; the pre-logits features, what a headless backbone such
as DINOv2 returns as `model(x)`), clstoken, clstoken_avgpool, lastN_clstoken (e.g.
last4_clstoken), image_embeds (a CLIP tower's projection) or output (the model's output).
FILE.npz holds two arrays, `paths` (N,) and `features` (N, D) float32 (`np.load(FILE)`, no
pickle; the format for large jobs); FILE.csv one row per image, `path, f0, ..., f{D-1}`;
FILE.json a list of {"path", "embedding"}. With a classifier, each image's classes come from
the same forward pass as its features, kept in the shards (so they too continue after a kill):
--output FILE gets them, or one summary line stands for them (no line per image in a large
job); --tta and --explain need passes of their own, which follow. A model without a classifier head
(num_classes=0) classifies nothing: it takes --features and --explain (last_block by default, or
rollout) only. Nothing is written when no image could be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli.flags import (
    ArgumentParser,
    add_model_arguments,
    add_model_dtype_argument,
    add_runtime_argument,
    add_threads_argument,
    command_name,
    runs_as_command,
)
from .inference.options import TTA_CHOICES

METHOD_NAMES = ("gradient_rollout", "last_block", "relevance", "rollout")  # --method
OUTPUT_SUFFIXES = (".csv", ".json")
FEATURE_SUFFIXES = (".npz", ".csv", ".json")
# vit.inference.embed.DEFAULT_SHARD_IMAGES, not imported here: --help answers before torch is loaded
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
        prog=command_name(__name__, "vit.predict"),
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
    add_runtime_argument(parser)
    parser.add_argument("--output", type=Path, help="write the predictions to FILE.csv or .json")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output or --features file, or --explain's earlier maps "
        "(refused otherwise; an image being read is never replaced)",
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


if runs_as_command(__name__, "vit.predict"):
    # `python -m vit.predict` or `vit-predict`: --help and flag mistakes are answered before
    # the imports below load torch (seconds); main() reads the flags again, at no cost.
    build_parser().parse_args()

# ruff: noqa: E402  (the imports below come after the early answer above, on purpose)
import contextlib
import io
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import torch
from tqdm import tqdm

from .cli.flags import (
    disk_full,
    interrupt_status,
    kept_output,
    missing_model_argument,
    runtime_problem,
    sigterm_as_ctrl_c,
    stopped_how,
    unwritable,
    use_threads,
)
from .cli.model_argument import model_from_flags
from .data.images import expand_image_paths
from .explain.readout import unexplained_readout
from .inference.embed import (
    POOL_HINT,
    POOLS_NOTHING,
    FeaturesError,
    FeaturesResult,
    check_embedding,
    describe,
    pools_nothing,
)
from .inference.precision import cast_for_inference
from .inference.predict_job import (
    PredictJob,
    RecordWriter,
    classified_batches,
    embed,
    print_records,
)
from .interop.onnx_runtime import onnx_device, refuse_flags
from .models.vision_transformer import VisionTransformer
from .utils import locks, process_group
from .utils.files import atomic_write
from .utils.process_group import DistInfo, cleanup, from_env, resolve_device, setup

T = TypeVar("T")


class InputError(Exception):
    """A problem with what the user passed, reported as one line without a traceback."""


class _NothingRead(Exception):
    """No image was read: the --output file being written is dropped, an earlier one kept."""


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
    if args.workers < 0:
        parser.error(
            f"--workers must be at least 0 (0: decode in the main thread), got {args.workers}"
        )
    if args.method is not None and args.explain is None:
        parser.error(f"--method {args.method} chooses --explain's maps: pass --explain DIR too")
    problem = missing_model_argument(args) or runtime_problem(args)
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
    if args.output is not None and args.features is not None:
        if args.output.resolve() == args.features.resolve():
            raise InputError(f"--output {args.output}: --features writes there too; give two files")
    for flag in ("output", "features"):
        path = getattr(args, flag)
        problem = path is not None and kept_output(f"--{flag}", path, args.overwrite)
        if problem:
            raise InputError(problem)


def predictions(count: int) -> str:
    return f"{count} prediction" + ("" if count == 1 else "s")


def check_explain_targets(args: argparse.Namespace, paths: list[Path]) -> None:
    """--explain DIR writes one PNG per image: never over an image being read, nor among the
    images (where the next prediction of their folder would read the maps as images), and over
    a map written before only with --overwrite."""
    from .inference.explanations import explanation_paths

    inputs = {path.resolve() for path in paths}
    image_folders = {path.parent for path in inputs}
    targets = list(explanation_paths(paths, args.explain).values())
    for target in targets:
        if target.resolve() in inputs:
            raise InputError(
                f"--explain {args.explain}: the map of {target} would replace that image; "
                f"choose a folder apart from the images"
            )
        if target.resolve().parent in image_folders:
            raise InputError(
                f"--explain {args.explain}: the map {target} would go among the images being "
                f"read, which the next prediction of their folder would read as images; choose "
                f"a folder apart from the images"
            )
    existing = [target for target in targets if target.exists()]
    if existing and not args.overwrite:
        raise InputError(
            f"--explain {args.explain}: {len(existing)} of the maps exist ({existing[0]}"
            f"{', ...' if len(existing) > 1 else ''}); add --overwrite to replace them, or "
            f"choose another folder"
        )


def check_pooled(args: argparse.Namespace, model: VisionTransformer) -> None:
    """A model that pools nothing (global_pool='') gives a row per token: without a head it
    embeds (the class token's choices of --embedding), but it classifies nothing. --explain
    needs a readout whose attention rows a map can follow (not "", "max" or "avgmax")."""
    if pools_nothing(model) and model.num_classes > 0:
        given = f"--checkpoint {args.checkpoint}" if args.checkpoint else f"--model {args.model}"
        raise InputError(f"{given}: {POOLS_NOTHING}, its head classifying every token; {POOL_HINT}")
    problem = args.explain is not None and unexplained_readout(model)
    if problem:
        raise InputError(f"--explain {args.explain}: {problem}")


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
    if args.tta != "none":
        raise InputError(
            f"--tta {args.tta}: averages the classifier head's probabilities over views, and "
            f"{what}; leave out --tta"
        )
    if args.explain is not None and args.method not in (None, "last_block", "rollout"):
        raise InputError(
            f"--method {args.method} explains a class and {what}: use --method last_block (the "
            "default) or rollout (or vit.explain with direction= to explain a similarity)"
        )


def check_distributed(args: argparse.Namespace, info: DistInfo) -> None:
    """Under torchrun the processes split the --features work; nothing else is split."""
    if not info.enabled:
        return
    for flag in ("output", "explain"):  # first: adding --features would not make them work
        if getattr(args, flag) is not None:
            raise InputError(
                f"--{flag}: under torchrun, predict splits --features only; "
                f"run --{flag} in a single process"
            )
    if args.features is None:
        raise InputError("under torchrun, predict splits --features FILE only; add it")


def writable_location(flag: str, path: Path, folder: bool) -> None:
    """Fail now, in one line, if `path` could not be written at the end."""
    problem = unwritable(flag, path, folder)
    if problem:
        raise InputError(problem)


@contextlib.contextmanager
def hold_output(flag: str, path: Path, folder: bool = False):
    """--output/--features FILE (or the --explain folder) for this job alone while it writes:
    another job writing there is refused in one line naming the process that holds it."""
    try:
        with locks.hold(path, folder=folder):
            yield
    except locks.LockError as e:
        raise InputError(f"--{flag} {e}") from None


def build_job(args: argparse.Namespace, model: VisionTransformer, paths: list[Path]) -> PredictJob:
    """The flags, checked, as one frozen job for `model`."""
    method = None
    if args.explain is not None:
        method = args.method or ("rollout" if model.num_classes > 0 else "last_block")
    return PredictJob(
        paths=tuple(paths),
        top_k=min(args.top_k, model.num_classes),
        batch_size=args.batch_size,
        workers=args.workers,
        tta=args.tta,
        explain=args.explain,
        method=method,
        weights=weights_label(args, model) if args.explain else "",
        features=args.features,
        embedding=args.embedding,
        shard_size=args.shard_size,
        overwrite=args.overwrite,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    info = from_env()
    with unless_main_quiet(info):
        args = parser.parse_args(argv)
    try:
        with sigterm_as_ctrl_c():
            return predict(parser, args, info)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: one line, what was kept, how to go on
        if info.is_main:
            print(interrupted_message(args, how=stopped_how(e)), file=sys.stderr)
        return interrupt_status(e)
    except OSError as e:
        how = disk_full(e)
        if how is None:
            raise
        print(interrupted_message(args, how=how), file=sys.stderr)
        return 1


def interrupted_message(args: argparse.Namespace, how: str = "interrupted") -> str:
    """After Ctrl-C (or `how` it stopped): what the job kept, and how to go on."""
    from .inference.embed import finished_shards, parts_folder

    kept = []
    if args.features is not None:
        shards = finished_shards(args.features)
        kept.append(
            f"{shards} finished shard{'' if shards == 1 else 's'} of --features {args.features} "
            f"kept in {parts_folder(args.features)}, from which the same command continues"
            if shards
            else f"--features {args.features}: no shard finished yet"
        )
    if args.output is not None:
        kept.append(f"--output {args.output} not written (it is put in place at the end)")
    if args.explain is not None:
        kept.append(f"the maps written so far in --explain {args.explain} (--overwrite replaces)")
    return "; ".join([how, *kept])


def unless_main_quiet(info: DistInfo):
    """stderr as it is on rank 0, silenced on the others: argparse's refusals, which under
    torchrun every process meets, said once."""
    return contextlib.nullcontext() if info.is_main else contextlib.redirect_stderr(io.StringIO())


def predict(parser: argparse.ArgumentParser, args: argparse.Namespace, info: DistInfo) -> int:
    """The command after its flags are read; the exit status."""
    outputs = contextlib.ExitStack()  # this process's hold on --output and --features
    try:
        with unless_main_quiet(info):
            check_args(parser, args)
        check_distributed(args, info)
        paths, problems = expand_image_paths(args.images)
        if not paths:  # before the model is loaded: nothing to do
            raise InputError("; ".join(problems))
        if args.explain is not None:
            check_explain_targets(args, paths)
        use_threads(args.threads)
        device = resolve_device(onnx_device(args), info)
        setup(info, device)  # torchrun: join the others (gloo on CPU); nothing otherwise
        with process_group.failing_together(info, (InputError,)):  # hold_output's refusal
            if info.is_main:  # one writer per output file: another job's is refused
                for flag in ("output", "features", "explain"):
                    if getattr(args, flag) is not None:
                        folder = flag == "explain"  # a folder of maps
                        outputs.enter_context(hold_output(flag, getattr(args, flag), folder))
        model = model_from_flags(args, onnx=args.runtime).to(device)
        given = {
            "--explain": args.explain is not None,
            "--features": args.features is not None,
            "--model-dtype": args.model_dtype != "float32",
        }
        refuse_flags(model, given, args.embedding)
        warning = cast_for_inference(model, args.model_dtype, device)
        if warning and info.is_main:
            print(f"warning: {warning}", file=sys.stderr)
        check_pooled(args, model)
        check_headless(args, model)
        if args.features is not None:
            args.embedding = check_embedding(model, args.embedding)
        job = build_job(args, model, paths)
    except (InputError, ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        outputs.close()
        if info.is_main:  # under torchrun every process meets the same mistake: one line
            print(f"error: {e}", file=sys.stderr)
        return 2
    # --features on a classifier: its classes come from the features' own forward pass, unless
    # test-time views or explanations need passes of their own.
    one_pass = job.features is not None and model.num_classes > 0
    one_pass = one_pass and job.tta == "none" and job.explain is None
    try:
        code = 0
        if job.features is not None:
            said = problems if info.is_main else []
            code = embed_images(job, args.output, model, device, said, info, classify=one_pass)
            problems = []  # said by embed_images
        if code != 2 and not info.enabled and not one_pass and (model.num_classes or job.explain):
            # with --features, the unreadable images are already said
            quiet = job.features is not None
            code = max(code, classify_images(job, args.output, model, device, problems, quiet))
        return code
    finally:
        outputs.close()
        cleanup()


def embed_images(
    job: PredictJob,
    output: Path | None,
    model: VisionTransformer,
    device: torch.device,
    problems: list[str],
    info: DistInfo,
    classify: bool = False,
) -> int:
    """--features through the embedding engine: says what it wrote; the exit status. classify:
    the images' classes too, from the same forward pass, streamed to `output` (or summed up in
    one line without it)."""
    summary = ClassSummary()
    try:
        if not classify:
            result = embed(job, model, device)
        elif output is None:
            result = embed(job, model, device, sink=summary.add)
        else:
            try:
                result = write_records(
                    output, job.top_k, lambda sink: embed(job, model, device, sink)
                )
                print(f"wrote {predictions(result.count)} to {output}", file=sys.stderr)
            except _NothingRead as nothing:
                result = nothing.args[0]
                problems = problems + [f"no image was read; --output {output} was not written"]
    except FeaturesError as e:  # the job's own mistake, the same on every process
        if info.is_main:
            print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --features {job.features}: cannot write it ({e})", file=sys.stderr)
        return 2
    if not info.is_main:
        return 0
    if classify and output is None and summary.count:
        print(summary.line(), file=sys.stderr)
    messages = features_report(job, result) + problems
    for message in messages:
        print(f"error: {message}", file=sys.stderr)
    return 1 if messages else 0


def features_report(job: PredictJob, result: FeaturesResult) -> list[str]:
    """Say what --features wrote; the error lines to say after it (unreadable images)."""
    problems = []
    if result.path is not None:
        resumed = f"; {result.resumed_shards} shards from an earlier run" * bool(
            result.resumed_shards
        )
        print(
            f"wrote {result.count} embeddings ({result.dim} values each, "
            f"{describe(job.embedding)}) to {job.features}{resumed}",
            file=sys.stderr,
        )
    else:
        problems.append(f"no image was read; --features {job.features} was not written")
    problems = [reason for _, reason in result.errors[:5]] + problems
    if len(result.errors) > 5:
        problems.append(f"{len(result.errors) - 5} more unreadable images")
    if result.errors_path is not None:
        problems.append(f"{len(result.errors)} unreadable images listed in {result.errors_path}")
    return problems


def classify_images(
    job: PredictJob,
    output: Path | None,
    model: VisionTransformer,
    device: torch.device,
    problems: list[str],
    quiet: bool = False,
) -> int:
    """Classes (printed, or streamed to `output`) and --explain maps; the exit status. quiet:
    the unreadable images are not said again (--features said them)."""
    if job.explain:  # matplotlib, which draws the maps, is imported only then
        from .inference.explanations import rollout_note

        note = rollout_note(model, job.method)
        if note:
            print(note, file=sys.stderr)
    summary = ClassSummary()
    if output is None:
        # a --features job is a large one: one summary line instead of lines per image
        show = summary.add if job.features is not None else lambda r: print_records(r, job.top_k)
        count, unreadable = run_batches(job, model, device, show)
        if summary.count:
            print(summary.line(), file=sys.stderr)
    else:
        try:
            count, unreadable = write_records(
                output, job.top_k, lambda sink: run_batches(job, model, device, sink)
            )
            print(f"wrote {predictions(count)} to {output}", file=sys.stderr)
        except _NothingRead as nothing:
            count, unreadable = nothing.args[0]
            problems = problems + [f"no image was read; --output {output} was not written"]
        except OSError as e:
            print(f"error: --output {output}: cannot write it ({e})", file=sys.stderr)
            return 2
    if job.explain and count:
        print(f"wrote {count} attention maps to {job.explain}", file=sys.stderr)
    problems = problems + ([] if quiet else unreadable)
    for message in problems:
        print(f"error: {message}", file=sys.stderr)
    return 1 if problems or not count else 0


def write_records(output: Path, top_k: int, produce: Callable[[Callable], T]) -> T:
    """`produce(sink)`'s records streamed into `output` (CSV or JSON), put in place only once
    complete; returns what `produce` returned, or raises _NothingRead with it if no record
    came (the file is then not written, an earlier one kept)."""
    result = None

    def write(tmp: Path) -> None:
        nonlocal result
        # a file name that is not UTF-8 (Latin-1 from an old archive: Python's surrogate escapes)
        # is written as its bytes, not refused mid-file
        with open(tmp, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
            writer = RecordWriter(f, top_k, as_json=output.suffix.lower() == ".json")
            result = produce(writer.write)
            writer.close()
        if writer.count == 0:
            raise _NothingRead(result)

    atomic_write(output, write)
    return result


class ClassSummary:
    """The one line that stands for per-image lines in a large job: how many images were
    classified, and their most frequent top-1 classes."""

    def __init__(self) -> None:
        self.labels: Counter[str] = Counter()
        self.count = 0

    def add(self, records: list[dict]) -> None:
        self.labels.update(record["label"] for record in records)
        self.count += len(records)

    def line(self) -> str:
        common = ", ".join(f"{label} {n}" for label, n in self.labels.most_common(3))
        return (
            f"classified {self.count} images; most frequent top-1 classes: {common} "
            f"(--output FILE.csv writes each image's classes)"
        )


def run_batches(
    job: PredictJob,
    model: VisionTransformer,
    device: torch.device,
    sink: Callable[[list[dict]], None],
) -> tuple[int, list[str]]:
    """Hand each batch's records to `sink` (a classifier's; a headless model's are not
    written), with a progress bar on a terminal: (images read, unreadable images)."""
    count, unreadable = 0, []
    progress = tqdm(
        total=len(job.paths),
        unit="img",
        file=sys.stderr,
        disable=len(job.paths) <= job.batch_size or None,  # None: only on a terminal
    )
    for result in classified_batches(job, model, device):
        unreadable += result.unreadable
        if model.num_classes > 0:
            sink(result.records)
        count += len(result.records)
        progress.update(len(result.records) + len(result.unreadable))
    progress.close()
    return count, unreadable


if __name__ == "__main__":
    sys.exit(main())
