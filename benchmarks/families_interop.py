"""How close transformers' DINOv2, CLIP, SigLIP, DeiT and MAE outputs are to ours, at the
published model sizes.

    python benchmarks/families_interop.py

In: each transformers class at its published geometry (ViT-S/14 for DINOv2 with 518-px position
embeddings, ViT-B/16 for the others), randomly initialised with every parameter then perturbed
(LayerScale starts at 1, norms at 1 and 0), saved with `save_pretrained` and read by
`vit.load_model` (DINOv2 at 224 px, as its preprocessing feeds it); and the real DINOv2 ViT-S/14
in ../shared/data/dinov2-small. Out: max |theirs - ours| / max |theirs| of what the class returns,
float32, eval mode, batch 2 of the same random images. For DINOv2 the last column shows what
timm's antialiased resampling would give instead of the source library's own.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import _cli
import torch
import transformers

import vit
from vit.interop.weights import read_checkpoint

REAL_DINOV2 = Path(__file__).resolve().parents[1] / "../shared/data/dinov2-small"
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
SMALL_14 = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14)
# name: (transformers class, config class, config arguments, output, input size)
CASES = {
    "DINOv2 ViT-S/14, 518 -> 224 px": (
        "Dinov2Model", "Dinov2Config", dict(SMALL_14, image_size=518), "pooler_output", 224,
    ),
    "DINOv2 ViT-S/14 reg4, 518 -> 224 px": (
        "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
        dict(SMALL_14, image_size=518, num_register_tokens=4), "pooler_output", 224,
    ),
    "CLIP ViT-B/16 (with projection)": (
        "CLIPVisionModelWithProjection", "CLIPVisionConfig",
        dict(BASE, patch_size=16, projection_dim=512), "image_embeds", 224,
    ),
    "SigLIP ViT-B/16 (attention pool)": (
        "SiglipVisionModel", "SiglipVisionConfig", dict(BASE, patch_size=16), "pooler_output", 224,
    ),
    "DeiT-B/16 distilled": (
        "DeiTForImageClassificationWithTeacher", "DeiTConfig", dict(BASE, num_labels=1000),
        "logits", 224,
    ),
    "MAE ViT-B/16 encoder": (
        "ViTMAEModel", "ViTMAEConfig", dict(BASE, mask_ratio=0.0), "last_hidden_state", 224,
    ),
}  # fmt: skip


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    return model.eval()


def their_output(model, x: torch.Tensor, output: str) -> torch.Tensor:
    extra = {}
    if isinstance(model, transformers.ViTMAEModel):  # no masking, patches kept in order
        extra["noise"] = torch.arange((x.shape[-1] // 16) ** 2.0).expand(len(x), -1)
    result = getattr(model(pixel_values=x, **extra), output)
    return result[:, 0] if output == "last_hidden_state" else result  # MAE: the class token


@torch.no_grad()
def compare(folder: Path, theirs, output: str, x: torch.Tensor) -> tuple[float, float | None]:
    """(ours vs theirs, or None; ours with timm's resampling vs theirs when ours resamples)."""
    reference = their_output(theirs, x, output)
    ours = vit.load_model(folder, img_size=x.shape[-1]).eval()
    exact = relative(ours(x), reference)
    checkpoint = read_checkpoint(folder)
    resampled = ours.pos_embed.shape != checkpoint.state_dict["pos_embed"].shape
    if checkpoint.pos_embed == "timm" or not resampled:
        return exact, None
    checkpoint.pos_embed = "timm"
    timm_way = vit.VisionTransformer(**ours.config.to_dict())
    vit.load_weights(timm_way, checkpoint)
    return exact, relative(timm_way.eval()(x), reference)


def main(argv: list[str] | None = None) -> None:
    _cli.parser(__doc__).parse_args(argv)
    print(
        f"torch={torch.__version__} transformers={transformers.__version__} float32 batch=2 "
        f"threads={torch.get_num_threads()}"
    )
    print("| model | transformers class -> `vit.load_model` | output | max rel. diff | "
          "with timm's resampling instead |")  # fmt: skip
    print("|---|---|---|---:|---:|")
    for name, (model_class, config_class, arguments, output, size) in CASES.items():
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**arguments)
        theirs = perturb(getattr(transformers, model_class)(config))
        with tempfile.TemporaryDirectory() as tmp:
            theirs.save_pretrained(tmp)
            exact, timm_way = compare(Path(tmp), theirs, output, x)
        other = f"{timm_way:.1e}" if timm_way is not None else ""
        shown = "last_hidden_state[:, 0]" if output == "last_hidden_state" else output
        print(f"| {name} | {model_class} | {shown} | {exact:.1e} | {other} |", flush=True)
    if REAL_DINOV2.is_dir():
        x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
        theirs = transformers.Dinov2Model.from_pretrained(REAL_DINOV2).eval()
        exact, timm_way = compare(REAL_DINOV2, theirs, "pooler_output", x)
        print(
            f"| real DINOv2 ViT-S/14 (shared/data/dinov2-small), 518 -> 224 px | Dinov2Model | "
            f"pooler_output | {exact:.1e} | {timm_way:.1e} |"
        )


if __name__ == "__main__":
    _cli.run(main)
