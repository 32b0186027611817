"""How close our outputs are to timm's, for every named model timm also has (the standard ViTs
and the DINOv2, CLIP, SigLIP, DeiT and DeiT III families), through both attention paths.

    python benchmarks/timm_equivalence.py [--models NAME ...] [--families] [--batch-size 2]
                                          [--max-depth N]

timm's randomly initialised weights are loaded into our model; both run in float32, eval mode,
on the same random images. The standard ViTs get a random 10-class head (so logits are not
zero); the family models keep their timm head (logits, or features for headless backbones),
and LayerScale factors drawn in [0.1, 1] instead of their 1e-5 start, so the blocks count.
Family models are also compared at a smaller input, their position embeddings resampled on
the fly (dynamic_img_size in both libraries). Prints max |ours - timm| / max |timm| per model,
path and size, and the worst overall.
"""

from __future__ import annotations

import _cli
import timm
import torch

import vit
from vit.cli.flags import number_in
from vit.models.registry import MODELS
from vit.utils.ranges import AT_LEAST_1

FAMILIES = ("dinov2", "clip", "siglip", "deit", "deit3")


def randomise_layer_scale(model: torch.nn.Module) -> None:
    """LayerScale starts at 1e-5 (DINOv2) or 1e-6 (DeiT III): the blocks would barely change the
    tokens and hide any difference in them. Trained values are of order 0.1-1; use those."""
    for name, p in model.named_parameters():
        if name.endswith(("ls1.gamma", "ls2.gamma")):
            p.data.uniform_(0.1, 1.0)


def _errors(theirs, ours, size: tuple[int, int], batch_size: int) -> list[float]:
    x = torch.randn(batch_size, 3, *size)
    reference = theirs(x)
    errors = []
    for fused in (True, False):
        ours.set_fused_attn(fused)
        errors.append(((ours(x) - reference).abs().max() / reference.abs().max()).item())
    return errors


@torch.inference_mode()
def relative_errors(name: str, batch_size: int, max_depth: int | None) -> list[float]:
    """[fused, explicit] at the native size, then at a resampled one for family models."""
    family = MODELS[name].family in FAMILIES
    kwargs = dict(dynamic_img_size=True) if family else dict(num_classes=10)
    if max_depth is not None and MODELS[name].arch["depth"] > max_depth:
        kwargs["depth"] = max_depth
    torch.manual_seed(0)
    theirs = timm.create_model(name, **kwargs).eval()
    randomise_layer_scale(theirs)
    ours = vit.create_model(name, **kwargs).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    errors = _errors(theirs, ours, ours.patch_embed.img_size, batch_size)
    if family:
        patch = ours.patch_embed.patch_size[0]
        side = patch * (5 if patch == 32 else 7)  # a few patches per side
        errors += _errors(theirs, ours, (side, side), batch_size)
    return errors


def main(argv: list[str] | None = None) -> None:
    standard = [n for n in vit.list_models() if n in timm.list_models()]
    parser = _cli.parser(__doc__)
    parser.add_argument(
        "--models", nargs="+", help="names of vit.list_models() that timm has (default: all)"
    )
    parser.add_argument("--families", action="store_true", help="only the family models")
    count = number_in(AT_LEAST_1)  # no image or no block: nothing to compare
    parser.add_argument("--batch-size", type=count, default=2)
    parser.add_argument("--max-depth", type=count, default=None, help="cap blocks (cost only)")
    args = parser.parse_args(argv)
    _cli.check_names(parser, "--models", args.models or [], standard)
    if args.models is None:
        in_family = [n for n in standard if MODELS[n].family in FAMILIES]
        args.models = in_family if args.families else standard
    print(
        f"torch={torch.__version__} timm={timm.__version__} float32 batch={args.batch_size}"
        + (f" max_depth={args.max_depth}" if args.max_depth is not None else "")
    )
    print("| model | fused SDPA | explicit softmax | resampled, fused | resampled, explicit |")
    print("|---|---:|---:|---:|---:|")
    worst = 0.0
    for name in args.models:
        errors = relative_errors(name, args.batch_size, args.max_depth)
        worst = max(worst, *errors)
        cells = [f"{e:.1e}" for e in errors] + ["-"] * (4 - len(errors))
        print(f"| {name} | {' | '.join(cells)} |", flush=True)
    print(f"worst relative difference: {worst:.2e}")


if __name__ == "__main__":
    _cli.run(main)
