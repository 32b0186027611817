"""Which matrix products' int8 costs accuracy: the model exported, then quantized as
`vit.export --int8` does with one group of layers (qkv, proj, fc1, fc2, head) left in float at a
time, scored against the float export on real images.

    python benchmarks/int8_sensitivity.py [--models cifar dinov2] [--images 500]

"cifar": the shipped model, top-1 on all 10,000 CIFAR-10 test images. "dinov2": the DINOv2-S/14
folder (../shared/data/dinov2-small), the embeddings' cosine similarity to the float export's
(min and mean) on the first --images test images of CIFAR-10 (50 per class at 500), in its own
preprocessing. A group whose float copy recovers most of the loss is the one to keep in float.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cli  # noqa: E402

import vit  # noqa: E402
from vit.cli.flags import number_in  # noqa: E402
from vit.inference.cpu_paths import cpu_flags  # noqa: E402
from vit.interop.onnx_export import export_onnx  # noqa: E402
from vit.utils.ranges import Range  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
SOURCES = {
    "cifar": ROOT / "weights" / "cifar10_vit_cpu.safetensors",
    "dinov2": DATA / "dinov2-small",
}
GROUPS = ("qkv", "proj", "fc1", "fc2", "head")
CLASSES = 10  # CIFAR-10's: --images are taken equally many of each


def layer_groups(path: Path) -> dict[str, list[str]]:
    """Group name -> the MatMul/Gemm nodes of that kind of layer (from the exporter's module
    scopes, e.g. "blocks.3.mlp.fc2")."""
    groups = collections.defaultdict(list)
    for node in onnx.load(str(path)).graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            scope = {p.key: p.value for p in node.metadata_props}.get(
                "pkg.torch.onnx.name_scopes", ""
            )
            group = next((g for g in GROUPS if g in scope), None)
            if group is not None:  # attention's activation products are no layer's
                groups[group].append(node.name)
    return dict(groups)


def test_images(model, count: int | None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 test images (N, 3, H, W) in the model's preprocessing, and labels (N,): every
    image, or `count` of them, equally many per class."""
    transform = vit.create_transform(model)
    root = test_folder()
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    images, labels = [], []
    for label, name in enumerate(classes):
        paths = sorted((root / name).glob("*.jpg"))
        for path in paths if count is None else paths[: count // len(classes)]:
            images.append(transform(Image.open(path).convert("RGB")))
            labels.append(label)
    return torch.stack(images).numpy(), np.array(labels)


def test_folder() -> Path:
    """The CIFAR-10 test images' folder (read from DATA when called: a test points it
    elsewhere)."""
    return DATA / "cifar10-jpg" / "test"


def outputs(path: Path, images: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    chunks = [images[i : i + 250] for i in range(0, len(images), 250)]
    return np.concatenate([session.run(None, {"pixel_values": c})[0] for c in chunks])


def score(name: str, out: np.ndarray, reference: np.ndarray, labels: np.ndarray) -> str:
    if name == "cifar":
        return f"top-1 {100 * (out.argmax(-1) == labels).mean():.2f}%"
    cosine = (out * reference).sum(1) / np.linalg.norm(out, axis=1)
    cosine /= np.linalg.norm(reference, axis=1)
    return f"cosine to float min {cosine.min():.4f} mean {cosine.mean():.5f}"


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--models", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    parser.add_argument(
        "--images",
        type=number_in(Range(CLASSES, integer=True)),  # fewer: none of some class
        default=500,
        help=f"dinov2's test images, a multiple of {CLASSES} (equally many of each class)",
    )
    args = parser.parse_args(argv)
    if args.images % CLASSES:  # rounded down, the table would count other images than asked
        parser.error(f"--images {args.images}: accepted: a multiple of {CLASSES}")
    # checked before any export: both models are scored on these images
    if not test_folder().is_dir():
        parser.error(f"no CIFAR-10 test images at {test_folder()}; this benchmark reads them")
    for name in args.models:
        if not Path(SOURCES[name]).exists():
            parser.error(f"--models {name}: no weights at {SOURCES[name]}")
    print(f"CPU: {cpu_flags()}; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = vit.load_model(str(SOURCES[name]))
            float_path, int8_path = Path(tmp) / f"{name}.onnx", Path(tmp) / f"{name}-int8.onnx"
            export_onnx(model, float_path)
            images, labels = test_images(model, None if name == "cifar" else args.images)
            reference = outputs(float_path, images)
            groups = layer_groups(float_path)
            counts = {group: len(nodes) for group, nodes in groups.items()}
            print(f"\n{name}: {len(images)} images; MatMul/Gemm nodes per group {counts}")
            print(f"  {'float32':16s} {score(name, reference, reference, labels)}")
            for label, exclude in [("all int8", [])] + [
                (f"{group} in float", nodes) for group, nodes in groups.items()
            ]:
                quantize_dynamic(
                    str(float_path),
                    str(int8_path),
                    op_types_to_quantize=["MatMul", "Gemm"],
                    per_channel=True,
                    weight_type=QuantType.QInt8,
                    nodes_to_exclude=exclude,
                )
                out = outputs(int8_path, images)
                print(f"  {label:16s} {score(name, out, reference, labels)}")


if __name__ == "__main__":
    _cli.run(main)
