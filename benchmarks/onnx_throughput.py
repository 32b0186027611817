"""CPU inference paths side by side: timm eager, ours eager in float32 and bfloat16 (weights
cast, `--model-dtype bfloat16`; and under autocast) (+ torch.compile), ONNX Runtime float32
(dynamic size, fixed size, optimized), int8 and static int8 (calibrated on 256 CIFAR-10
training images where ../shared/data has them), and OpenVINO float32, bfloat16 and the static
int8 file where it is installed (`pip install openvino`: not a dependency of the package), in
one run.

    python benchmarks/onnx_throughput.py [--models vit_small_patch16_224 cifar dinov2]
        [--batch-sizes 32 1] [--threads 1 2] [--rounds 3] [--compile] [--accuracy]

"cifar" is the shipped model (weights/cifar10_vit_cpu.safetensors, 32 px), "dinov2" the real
DINOv2 ViT-S/14 folder (../shared/data/dinov2-small, run at its 224 px, the position embeddings
resampled from 518 px as it does; timm's model gets the same weights and dynamic_img_size); a
model name is built with random weights (speed does not depend on them). bfloat16 is fast only
on CPUs with AVX512-BF16 or AMX (`vit.inference.precision.fast_bfloat16`, printed first):
elsewhere its rows show how much slower it is. The paths are timed in alternating
rounds (each path once per round, so machine load drifts hit all alike); each reports its
median round as images/s and the ratio to timm eager float32 in the same run. The ONNX files
are made by `vit.export.export_onnx` (each verified against our model as it is written).
--accuracy adds the shipped model's top-1 on the 10,000 CIFAR-10 test images
(../shared/data/cifar10-jpg/test, the model's own preprocessing) for PyTorch and each
ONNX file, and the files' sizes. The CPU's instruction sets are printed first.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import timm
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cli  # noqa: E402
from inference_throughput import timm_model  # noqa: E402

import vit  # noqa: E402
from vit.cli.flags import number_in  # noqa: E402
from vit.data.transforms import evaluation_images  # noqa: E402
from vit.inference.cpu_paths import time_paths  # noqa: E402
from vit.inference.precision import cast_for_inference, fast_bfloat16  # noqa: E402
from vit.interop.onnx_export import OnnxOptions, export_onnx, quantized_copy  # noqa: E402
from vit.models.registry import MODELS  # noqa: E402
from vit.utils.ranges import AT_LEAST_1, POSITIVE  # noqa: E402

try:  # an optional comparison: OpenVINO is not a dependency of the package
    import openvino
except ImportError:
    openvino = None

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "weights" / "cifar10_vit_cpu.safetensors"
# the shared data sits beside the repository, as in CI
CIFAR_TEST = ROOT.parent / "shared" / "data" / "cifar10-jpg" / "test"
DINOV2 = ROOT.parent / "shared" / "data" / "dinov2-small"
CALIBRATION_IMAGES = 256  # static int8's, from the CIFAR-10 training images
# the ONNX files timed, by the options they are exported with
ONNX_PATHS = {
    "ORT fp32": OnnxOptions(),
    "ORT fp32 fixed size": OnnxOptions(dynamic_size=False),
    "ORT fp32 optimized": OnnxOptions(optimize=True),
    "ORT int8": OnnxOptions(int8=True),
    "ORT int8 optimized": OnnxOptions(optimize=True, int8=True),
}


def load(name: str) -> tuple[vit.VisionTransformer, torch.nn.Module]:
    """Our model and timm's of the same architecture (random weights, or the shipped ones)."""
    torch.manual_seed(0)
    if name == "cifar":
        ours = vit.load_model(str(SHIPPED))
        c = ours.config
        arch = dict(
            img_size=c.img_size,
            patch_size=c.patch_size,
            embed_dim=c.embed_dim,
            depth=c.depth,
            num_heads=c.num_heads,
            mlp_ratio=c.mlp_ratio,
            class_token=c.class_token,
            global_pool=c.global_pool,
        )
        theirs = TimmViT(**arch, num_classes=c.num_classes)
        theirs.load_state_dict(ours.state_dict())
    elif name == "dinov2":
        ours = vit.load_model(str(DINOV2))  # 518 px position embeddings, dynamic_img_size
        theirs = timm.create_model(
            "vit_small_patch14_dinov2", img_size=518, dynamic_img_size=True, num_classes=0
        )
        theirs.load_state_dict(ours.state_dict())
    else:
        ours = vit.create_model(name)
        torch.nn.init.normal_(ours.head.weight, std=0.02)  # a zero head would hide differences
        theirs = timm_model(name)
    return ours.eval(), theirs.eval()


def export_all(model: vit.VisionTransformer, folder: Path) -> dict[str, Path]:
    """Every ONNX path's file, exported and verified; and static int8 calibrated on
    CALIBRATION_IMAGES CIFAR-10 training images where the shared data is there (a model whose
    static file fails its check is said and left out)."""
    files = {}
    for label, options in ONNX_PATHS.items():
        files[label] = folder / (label.replace(" ", "_") + ".onnx")
        result = export_onnx(model, files[label], options=options)
        print(f"  {label}: {result}")
    if CIFAR_TEST.parent.is_dir():
        cifar = str(CIFAR_TEST.parent)
        images = evaluation_images(cifar, "train", CALIBRATION_IMAGES, model.preprocess)
        static = OnnxOptions(int8=True, calibration=images)
        try:
            check = quantized_copy(files["ORT fp32"], folder / "static.onnx", model, static)
            files["ORT int8 static"] = check.path
            print(f"  ORT int8 static: {check}")
        except ValueError as e:
            print(f"  ORT int8 static: left out: {e}")
    return files


def ort_session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def openvino_model(path: Path, threads: int, precision: str):
    """The ONNX file compiled by OpenVINO for the CPU, computing in `precision` (f32, bf16)."""
    config = {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": precision,
        "PERFORMANCE_HINT": "LATENCY",  # one request at a time, as the other paths run
    }
    return openvino.Core().compile_model(str(path), "CPU", config)


def runners(models: dict, files: dict[str, Path], threads: int) -> dict:
    """Label -> a function of a numpy batch (B, C, H, W) running that path once. `models`:
    label -> a PyTorch model (or None where it could not be built)."""
    run = {
        label: lambda x, m=model: m(torch.from_numpy(x))
        for label, model in models.items()
        if model is not None
    }
    run["ours autocast bf16"] = autocast_runner(models["ours eager fp32"])
    for label, path in files.items():
        session = ort_session(path, threads)
        run[label] = lambda x, s=session: s.run(None, {"pixel_values": x})
    if openvino is not None:
        for precision in ("f32", "bf16"):
            compiled = openvino_model(files["ORT fp32"], threads, precision)
            run[f"OpenVINO {precision.replace('f32', 'fp32')}"] = compiled
        if "ORT int8 static" in files:  # OpenVINO runs the QDQ file's products in int8
            run["OpenVINO int8 static"] = openvino_model(files["ORT int8 static"], threads, "f32")
    return run


def autocast_runner(model):
    def run(x: np.ndarray):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(torch.from_numpy(x))

    return run


def try_compile(model, batch: np.ndarray):
    """torch.compile of our model, or None with the reason printed."""
    # Every configuration compiles anew: dynamo recompiles on a thread-count change, and past
    # its recompile limit it would silently run eager.
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model)
        with torch.inference_mode():
            compiled(torch.from_numpy(batch))
        return compiled
    except Exception as e:  # an inductor failure on this machine: skip the path, say why
        print(f"  torch.compile skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return None


@torch.inference_mode()
def cifar_accuracy(
    model: vit.VisionTransformer, bf16: vit.VisionTransformer, files: dict[str, Path], threads: int
) -> None:
    """Top-1 on the 10,000 CIFAR-10 test images for PyTorch (float32, bfloat16 weights), each
    ONNX file and OpenVINO where installed; file sizes."""
    from PIL import Image

    transform = vit.create_transform(model)
    names = model.class_names
    images, labels = [], []
    for label, name in enumerate(names):
        for path in sorted((CIFAR_TEST / name).glob("*.jpg")):
            images.append(transform(Image.open(path).convert("RGB")))
            labels.append(label)
    x, y = torch.stack(images), torch.tensor(labels)
    reference = torch.cat([model(chunk) for chunk in x.split(500)]).argmax(-1)
    print(f"\ntop-1 on {len(y)} CIFAR-10 test images (shipped model, 32 px):")
    print(f"  {'PyTorch fp32':22s} {100 * (reference == y).float().mean():.2f}%")

    def report(label: str, run, note: str = "") -> None:
        """`run`: a numpy batch (B, C, H, W) -> logits (B, K); its top-1 and agreement."""
        predicted = torch.cat([torch.as_tensor(run(c.numpy())) for c in x.split(500)]).argmax(-1)
        top1 = 100 * (predicted == y).float().mean()
        agree = 100 * (predicted == reference).float().mean()
        print(f"  {label:22s} {top1:.2f}%  (same prediction as PyTorch {agree:.2f}%{note})")

    report("PyTorch bf16 weights", lambda b: bf16(torch.from_numpy(b)))
    for label, path in files.items():
        session = ort_session(path, threads)
        size = f", {path.stat().st_size / 1e6:.2f} MB"
        report(label, lambda b, s=session: s.run(None, {"pixel_values": b})[0], size)
    if openvino is not None:
        for precision in ("f32", "bf16"):
            compiled = openvino_model(files["ORT fp32"], threads, precision)
            report(f"OpenVINO {precision}", lambda b, c=compiled: c(b)[0])


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument(
        "--models",
        nargs="+",
        default=["vit_small_patch16_224", "cifar"],
        help="names, cifar, dinov2",
    )
    count = number_in(AT_LEAST_1)  # 0 images, threads or rounds: no rate to give
    parser.add_argument("--batch-sizes", nargs="+", type=count, default=[32, 1])
    parser.add_argument("--threads", nargs="+", type=count, default=[1, 2])
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--round-seconds", type=number_in(POSITIVE), default=0.5)
    parser.add_argument("--compile", action="store_true", help="time torch.compile too")
    parser.add_argument("--accuracy", action="store_true", help="CIFAR-10 test top-1 per path")
    args = parser.parse_args(argv)
    _cli.check_names(parser, "--models", args.models, [*MODELS, "cifar", "dinov2"])
    native = "native" if fast_bfloat16(torch.device("cpu")) else "emulated, slow"
    versions = f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}"
    if openvino is not None:
        versions += f", openvino {openvino.__version__}"
    print(f"{_cli.machine()} (bfloat16 {native}); {versions}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, theirs = load(name)
            print(f"\n{name}: exporting")
            folder = Path(tmp) / name
            folder.mkdir()
            files = export_all(model, folder)
            size = model.preprocess.input_size
            bf16 = copy.deepcopy(model)
            cast_for_inference(bf16, "bfloat16", torch.device("cpu"))
            for threads in args.threads:
                torch.set_num_threads(threads)
                for batch_size in args.batch_sizes:
                    batch = torch.randn(batch_size, 3, *size).numpy()
                    models = {
                        "timm eager fp32": theirs,
                        "ours eager fp32": model,
                        "ours eager bf16": bf16,
                        "ours compiled fp32": try_compile(model, batch) if args.compile else None,
                        "ours compiled bf16": try_compile(bf16, batch) if args.compile else None,
                    }
                    run = runners(models, files, threads)
                    speed = time_paths(run, batch, args.rounds, args.round_seconds)
                    base = speed["timm eager fp32"]
                    print(f"\n{name} {size[0]} px, batch {batch_size}, {threads} thread(s)")
                    print(f"  {'path':22s} {'images/s':>10s} {'x timm':>7s}")
                    for label, value in speed.items():
                        print(f"  {label:22s} {value:10.1f} {value / base:7.2f}")
            if args.accuracy and name == "cifar":
                cifar_accuracy(model, bf16, files, max(args.threads))


if __name__ == "__main__":
    _cli.run(main)
