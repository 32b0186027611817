"""predict --explain: one PNG per image, its attention map beside it (rollout, gradient
rollout, relevance), or the last block's heads over it (DINO's picture)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from .. import explain
from ..models.families import family_of
from ..models.vision_transformer import VisionTransformer
from ..utils.plots import add_colorbar, denormalize, draw_overlay, plot_head_attention, save_figure

METHODS: dict[str, Callable[[VisionTransformer, torch.Tensor], torch.Tensor]] = {
    "rollout": explain.attention_rollout,
    "gradient_rollout": explain.gradient_rollout,
    "relevance": explain.relevance,
}
HEAD_MAP_CMAP = "inferno"  # plot_head_attention's colours, for the colour bar


def explanation_paths(paths: Sequence[Path], folder: Path) -> dict[Path, Path]:
    """One PNG per image under `folder`, mirroring the images' folders below their common
    parent (cats/a.jpg -> DIR/cats/a.png; a.jpg and a.png side by side -> a_jpg.png, a_png.png;
    a name still taken, by an a_jpg.jpg beside them, gets a number: a_jpg_2.png)."""
    absolute = [p.resolve() for p in paths]
    root = Path(os.path.commonpath([p.parent for p in absolute])) if absolute else Path()
    stems: dict[Path, int] = {}
    for p in absolute:
        key = p.relative_to(root).with_suffix("")
        stems[key] = stems.get(key, 0) + 1
    out, taken = {}, set()
    for original, p in zip(paths, absolute, strict=True):
        rel = p.relative_to(root)
        name = rel.stem if stems[rel.with_suffix("")] == 1 else f"{rel.stem}_{rel.suffix[1:]}"
        target, number = folder / rel.parent / f"{name}.png", 1
        while target in taken:  # one map must not replace another's
            number += 1
            target = folder / rel.parent / f"{name}_{number}.png"
        taken.add(target)
        out[original] = target
    return out


def explanation_figure(image: np.ndarray, heatmap: torch.Tensor, title: str, method: str):
    """The image (H, W, 3) in [0, 1] beside the same image with its map (gh, gw) over it."""
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.imshow(image, interpolation="nearest")
    left.set_title(title, fontsize=10)
    draw_overlay(right, image, heatmap)
    right.set_title(method.replace("_", " "), fontsize=10)
    for ax in (left, right):
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def head_maps_figure(image: np.ndarray, head_maps: torch.Tensor, title: str) -> Figure:
    """The DINO picture as notebooks/attention_maps.ipynb draws it: the image, then one map
    (gh, gw) per head of `head_maps` (nh, gh, gw) over it, with a colour bar."""
    fig = plot_head_attention(head_maps, image=image, title=title)
    add_colorbar(fig, cmap=HEAD_MAP_CMAP, label="attention / head max")
    return fig


def save_explanations(
    model: VisionTransformer,
    batch: torch.Tensor,
    records: list[dict],
    targets: dict[Path, Path],
    paths: Sequence[Path],
    method: str,
    weights: str,
) -> None:
    """Explain the batch with `method` (the predicted classes, or the last block's heads) and
    write one PNG per image (a headless model's records have no label: the title is the file
    name); `weights` names where the weights came from, for last_block's title."""
    pixels = denormalize(batch.cpu(), model.preprocess.mean, model.preprocess.std)  # (B, H, W, 3)
    if method == "last_block":
        heads = explain.last_block_attention(model, batch, include_registers=False)
        maps = heads.detach().cpu()  # (B, nh, gh, gw)
    else:
        maps = METHODS[method](model, batch).detach().cpu()  # (B, gh, gw)
    for path, record, image, heatmap in zip(paths, records, pixels, maps, strict=True):
        if "label" in record:
            title = f"{record['label']} ({record['probability']:.1%})"
        else:
            title = Path(path).name
        if method == "last_block":
            reader = "class token" if model.cls_token is not None else "readout"
            title = f"{title}: last block, {reader} to patches, per head. Weights: {weights}"
            fig = head_maps_figure(image, heatmap, title)
        else:
            fig = explanation_figure(image, heatmap, title, method)
        save_figure(fig, targets[path], dpi=100)


def rollout_note(model: VisionTransformer, method: str) -> str | None:
    """The note for rollout on DINOv2 without registers: its few lit patches are the model's."""
    if method == "rollout" and family_of(model).name == "dinov2":
        return (
            "note: rollout on DINOv2 without registers lights a few high-norm artifact patches, "
            "a property of the model (Darcet et al. 2024, 'Vision Transformers Need "
            "Registers'); --method last_block draws the heads"
        )
    return None
