"""Set-up shared by the notebooks' 224x224 sections: a real photograph, an ImageNet ViT and a
self-supervised one (DINOv2).

The photograph ships with matplotlib (no download). The models get timm's pretrained weights
when they can be had; DINOv2 then falls back to a local transformers folder (the project's
../shared/data/dinov2-small); otherwise random weights come with a printed note saying so, so
that the notebooks run, and every numerical check in them holds, offline (as in CI).
"""

from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path

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


DINOV2 = "vit_small_patch14_dinov2.lvd142m"  # timm's DINOv2 ViT-S/14 (Oquab et al. 2023)
DINOV2_FOLDER = Path("..") / "shared" / "data" / "dinov2-small"  # from the repository root


def self_supervised_vit(root: Path, seed: int = 0) -> tuple[vit.VisionTransformer, str]:
    """A DINOv2 ViT-S/14 backbone at 224 px and where its weights came from, in that order:
    timm's weights from the Hugging Face hub (when it answers, or from its cache with
    HF_HUB_OFFLINE=1), else the transformers folder `root / DINOV2_FOLDER`, else random
    weights (seeded) with a loud note. Returns (model in eval mode, a label for the figures).
    """
    if _hub_offline_mode() or _hub_reachable():
        try:
            model = vit.create_model(DINOV2, pretrained=True, img_size=224)
            return model.eval(), f"timm {DINOV2} (Hugging Face hub)"
        except Exception as error:  # no cache, no network, hub error: all mean "fall back"
            reason = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    else:
        reason = "huggingface.co cannot be reached"
    folder = root / DINOV2_FOLDER
    if (folder / "config.json").is_file():
        print(f"timm's {DINOV2} not loaded ({reason}); using the local folder {DINOV2_FOLDER}")
        model = vit.load_model(os.path.relpath(folder)).eval()  # relative: no local paths shown
        return model, f"{DINOV2_FOLDER.as_posix()} (DINOv2 ViT-S/14, see its README)"
    torch.manual_seed(seed)
    model = vit.VisionTransformer(
        img_size=224, patch_size=14, embed_dim=384, depth=12, num_heads=6, init_values=1.0,
        num_classes=0,
    ).eval()  # fmt: skip
    model.preprocess = vit.Preprocess(
        input_size=(224, 224), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
        crop_pct=0.875,
    )  # fmt: skip
    print(
        f"NOTE: RANDOM WEIGHTS. Neither timm's {DINOV2} ({reason}) nor the folder {folder} "
        f"could be used. The DINOv2-shaped model below has random weights (seed {seed}): the "
        "maps show nothing learned, only that the machinery runs."
    )
    return model, "RANDOM weights (maps meaningless)"
