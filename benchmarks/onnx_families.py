"""ONNX export of every family, checked in onnxruntime: a markdown table.

    python benchmarks/onnx_families.py                  # about 5-10 min on 2 CPU cores
    python benchmarks/onnx_families.py --names deit_tiny_distilled_patch16_224

In: timm's architectures of each family by name (random weights with a random head and
LayerScale set to 1, so that no branch is close to zero and hides a difference; DINOv2 at
224 px as its preprocessing feeds it), and the real DINOv2 ViT-S/14 backbone in
../shared/data/dinov2-small when it is there. Each goes through `vit.export.export_onnx`
(opset 23, dynamic batch), which runs the written file in onnxruntime at batch sizes 1 and 3.
Out: what the graph returns (logits, or a headless model's pooled embeddings) and the max
|onnxruntime - ours| / max |ours| that the export's own check measured, float32.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import _cli
import torch

import vit
from vit.interop.onnx_export import export_onnx
from vit.models.registry import MODELS

REAL_DINOV2 = Path(__file__).resolve().parents[1] / "../shared/data/dinov2-small"
# name: what its switches are, for the table
NAMES = {
    "vit_small_patch14_dinov2": "DINOv2: LayerScale, patch 14, headless",
    "vit_small_patch14_reg4_dinov2": "DINOv2 + 4 registers, headless",
    "vit_base_patch32_clip_quickgelu_224": "OpenAI CLIP: pre_norm, QuickGELU",
    "vit_base_patch16_siglip_224": "SigLIP: attention pool, no class token",
    "deit_tiny_distilled_patch16_224": "DeiT: distillation token + head",
    "deit3_small_patch16_224": "DeiT III: LayerScale, no_embed_class",
}


def random_model(name: str) -> vit.VisionTransformer:
    size = 224 if "dinov2" in name else None  # DINOv2's preprocessing crops 224 px
    model = vit.create_model(name, img_size=size)
    torch.manual_seed(0)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if key.endswith("gamma"):
                parameter.fill_(1.0)
            elif key.startswith(("head.weight", "head_dist.weight")):
                torch.nn.init.normal_(parameter, std=0.02)
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--names", nargs="+", default=list(NAMES), help="timm model names")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    _cli.check_names(parser, "--names", args.names, MODELS)
    torch.set_num_threads(args.threads)
    cases = [
        (name, NAMES.get(name, ""), lambda name=name: random_model(name)) for name in args.names
    ]
    if REAL_DINOV2.is_dir():
        label = "real DINOv2 ViT-S/14 (../shared/data/dinov2-small)"
        cases.append((label, "transformers folder, 224 px", lambda: vit.load_model(REAL_DINOV2)))
    print(f"torch {torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}")
    print("| model | family switches | output | max rel. diff (onnxruntime vs ours) |")
    print("|---|---|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, what, build in cases:
            model = build()
            check = export_onnx(model, Path(tmp) / "model.onnx")
            output = f"{check.compared} ({model.num_classes or model.num_features})"
            print(f"| {name} | {what} | {output} | {check.max_relative_difference:.1e} |")


if __name__ == "__main__":
    _cli.run(main)
