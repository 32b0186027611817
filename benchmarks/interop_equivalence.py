"""How close other libraries' logits are to ours, both ways, at full model sizes.

    python benchmarks/interop_equivalence.py [--sizes base large huge] [--no-onnx]

In: a randomly initialised transformers `ViTForImageClassification` (ViT-B/16 geometry, its
default LayerNorm eps 1e-12) saved with `save_pretrained` and read by `vit.load_model`, and each
torchvision builder (`vit_b_16`, ...) saved as a state dict and read by
`vit.create_model(name, pretrained=FILE)`. Out: our model exported with `vit.export` to ONNX
(run in onnxruntime), a transformers folder and a torchvision state dict. All float32, eval
mode, the same random images; printed as max |theirs - ours| / max |ours|. Random weights stand
in for published ones (nothing is downloaded): the layouts and kernels are what is compared.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torchvision
import transformers

import vit
from vit.interop.onnx_export import export_onnx
from vit.interop.torchvision_export import export_torchvision
from vit.interop.transformers_export import export_transformers

# our name: (torchvision builder, transformers geometry: hidden, layers, heads, patch)
SIZES = {
    "base": [
        ("vit_base_patch16_224", "vit_b_16", (768, 12, 12, 16)),
        ("vit_base_patch32_224", "vit_b_32", None),
    ],
    "large": [
        ("vit_large_patch16_224", "vit_l_16", (1024, 24, 16, 16)),
        ("vit_large_patch32_224", "vit_l_32", None),
    ],
    "huge": [("vit_huge_patch14_224", "vit_h_14", None)],
}


def relative(theirs: torch.Tensor, ours: torch.Tensor) -> float:
    return ((theirs - ours).abs().max() / ours.abs().max()).item()


@torch.no_grad()
def transformers_in(geometry: tuple, folder: Path, x: torch.Tensor) -> float:
    hidden, layers, heads, patch = geometry
    config = transformers.ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        patch_size=patch,
        num_labels=1000,
    )
    theirs = transformers.ViTForImageClassification(config).eval()
    theirs.save_pretrained(folder)
    ours = vit.load_model(folder).eval()
    return relative(ours(x), theirs(pixel_values=x).logits)


@torch.no_grad()
def torchvision_in(name: str, builder: str, path: Path, x: torch.Tensor) -> float:
    theirs = getattr(torchvision.models, builder)(weights=None).eval()
    torch.nn.init.normal_(theirs.heads.head.weight, std=0.02)  # torchvision zeroes its head
    torch.save(theirs.state_dict(), path)
    ours = vit.create_model(name, num_classes=1000, pretrained=path).eval()
    return relative(ours(x), theirs(x))


def exports_out(name: str, folder: Path, onnx: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = vit.create_model(name, num_classes=1000).eval()
    torch.nn.init.normal_(model.head.weight, std=0.02)
    results = {
        "transformers": export_transformers(model, folder / "hf").max_relative_difference,
        "torchvision": export_torchvision(model, folder / "tv.pth").max_relative_difference,
    }
    if onnx:
        results["onnxruntime"] = export_onnx(model, folder / "m.onnx").max_relative_difference
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["base"])
    parser.add_argument("--no-onnx", action="store_true", help="skip the (slow) ONNX export")
    args = parser.parse_args()
    print(
        f"torch={torch.__version__} torchvision={torchvision.__version__} "
        f"transformers={transformers.__version__} float32 batch=2 threads={torch.get_num_threads()}"
    )
    print("| direction | model | max rel. logit diff |")
    print("|---|---|---:|")
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    for size in args.sizes:
        for name, builder, geometry in SIZES[size]:
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                torch.manual_seed(0)
                if geometry is not None:
                    diff = transformers_in(geometry, tmp / "hf-in", x)
                    print(f"| transformers -> ours | {name} (eps 1e-12) | {diff:.1e} |", flush=True)
                diff = torchvision_in(name, builder, tmp / "tv-in.pth", x)
                print(f"| torchvision -> ours | {builder} | {diff:.1e} |", flush=True)
                for target, diff in exports_out(name, tmp, onnx=not args.no_onnx).items():
                    print(f"| ours -> {target} | {name} | {diff:.1e} |", flush=True)
            print(f"<!-- {name}: {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
