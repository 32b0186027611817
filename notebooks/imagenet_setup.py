"""Set-up shared by the notebooks' 224x224 sections: a real photograph and an ImageNet ViT.

The photograph ships with matplotlib (no download). The model gets timm's pretrained weights
when they can be had, and otherwise random weights with a printed note saying so, so that the
notebooks run, and every numerical check in them holds, offline (as in CI).
"""

from __future__ import annotations

import os
import socket
import warnings

import matplotlib.cbook as cbook
import torch
from PIL import Image
from tqdm import TqdmWarning

import vit

with warnings.catch_warnings():
    # timm's import pulls in tqdm.auto, which warns in Jupyter when ipywidgets is missing;
    # nothing here draws a progress bar
    warnings.simplefilter("ignore", TqdmWarning)
    from timm.data import ImageNetInfo


def sample_photo() -> Image.Image:
    """Grace Hopper's portrait (512x600 RGB) from matplotlib's bundled sample data."""
    return Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")


def imagenet_label(index: int) -> str:
    """The short name of ImageNet-1k class `index`, e.g. 457 -> 'bow tie'."""
    return ImageNetInfo().index_to_description(index).split(",")[0]


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _hub_offline_mode() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def pretrained_or_random(name: str, seed: int = 0) -> tuple[vit.VisionTransformer, bool]:
    """`vit.create_model(name, pretrained=True)` in eval mode if possible, else random weights.

    Returns (model, pretrained). The download is only attempted when huggingface.co answers or
    HF_HUB_OFFLINE is set (then timm reads the Hugging Face cache only): without a network the
    hub client would otherwise retry for about a minute before failing. The random fallback is
    seeded and gets a random classifier head (the package initialises heads to zero, which would
    make every logit 0 and a logits check vacuous).
    """
    if _hub_offline_mode() or _hub_reachable():
        try:
            return vit.create_model(name, pretrained=True).eval(), True
        except Exception as error:  # no cache, no network, hub error: all mean "fall back"
            reason = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    else:
        reason = (
            "huggingface.co cannot be reached; with the weights already in the Hugging Face "
            "cache, set HF_HUB_OFFLINE=1 to use them"
        )
    torch.manual_seed(seed)
    model = vit.create_model(name).eval()
    with torch.no_grad():
        torch.nn.init.trunc_normal_(model.head.weight, std=0.02)
    print(
        f"NOTE: RANDOM WEIGHTS. timm's pretrained {name} could not be loaded ({reason}).\n"
        f"The model below has random weights (seed {seed}): everything runs the same and every "
        f"numerical check holds, but the pictures show nothing learned and the predicted "
        f"classes mean nothing."
    )
    return model, False
