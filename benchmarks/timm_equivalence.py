"""How close our logits are to timm's, for every standard config, through both attention paths.

    python benchmarks/timm_equivalence.py [--models NAME ...] [--batch-size 2]

timm's randomly initialised weights (with a random 10-class head, so logits are not zero)
are loaded into our model; both run in float32, eval mode, on the same random images.
Prints max |ours - timm| / max |timm| per model and path, and the worst overall.
"""

from __future__ import annotations

import argparse

import timm
import torch

import vit


@torch.inference_mode()
def relative_errors(name: str, batch_size: int) -> tuple[float, float]:
    torch.manual_seed(0)
    theirs = timm.create_model(name, num_classes=10).eval()
    ours = vit.create_model(name, num_classes=10).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(batch_size, 3, *ours.patch_embed.img_size)
    reference = theirs(x)
    errors = []
    for fused in (True, False):
        ours.set_fused_attn(fused)
        errors.append(((ours(x) - reference).abs().max() / reference.abs().max()).item())
    return errors[0], errors[1]


def main() -> None:
    standard = [n for n in vit.list_models() if n in timm.list_models()]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=standard)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    print(f"torch={torch.__version__} timm={timm.__version__} float32 batch={args.batch_size}")
    print("| model | fused SDPA | explicit softmax |")
    print("|---|---:|---:|")
    worst = 0.0
    for name in args.models:
        fused, explicit = relative_errors(name, args.batch_size)
        worst = max(worst, fused, explicit)
        print(f"| {name} | {fused:.1e} | {explicit:.1e} |", flush=True)
    print(f"worst relative logit difference: {worst:.2e}")


if __name__ == "__main__":
    main()
