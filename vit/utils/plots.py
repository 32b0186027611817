"""Every figure of the package: training curves, confusion matrices, attention pictures.

Each plotting function returns a `matplotlib.figure.Figure` built without pyplot: no global
state, no GUI backend, safe in any process (Agg included). `save_figure(fig, path)` writes one
atomically (a killed run leaves no half PNG); `fig.savefig("x.png")` works too, and in a notebook
a figure shows when it is a cell's last expression or passed to `display(fig)`.

Attention maps are min-max rescaled *here*, for display only; `vit.explain` returns raw values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .files import atomic_write, atomic_write_files


def save_figure(
    fig: Figure,
    path: str | Path,
    dpi: int = 110,
    beside: Mapping[Path, Callable[[Path], object]] | None = None,
) -> Path:
    """Write `fig` as a PNG atomically (a killed run leaves the old file, never half a PNG).
    `beside`: files of the PNG's folder that belong with it (a report), each written by its
    `write(tmp_path)`: all are written first and put in place together
    (`vit.utils.files.atomic_write_files`), so that where one fails, none replaces what was
    there."""
    path = Path(path)
    if not beside:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
        return path

    def write_all(folder: Path) -> None:
        fig.savefig(folder / path.name, format="png", dpi=dpi)
        for other, write in beside.items():
            write(folder / Path(other).name)

    atomic_write_files([*map(Path, beside), path], write_all)
    return path


# -- training and evaluation ---------------------------------------------------------------------
def plot_curves(history: Sequence[dict]) -> Figure:
    """Loss and accuracy per epoch from metrics rows (keys as in metrics.csv)."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    for key, label in (("train_loss", "train"), ("test_loss", "test")):
        ax_loss.plot(*_series(history, key), marker=".", label=label)
    for key, label in (
        ("train_acc", "train (top-1, on augmented batches)"),
        ("test_top1", "test top-1"),
        ("test_top5", "test top-5"),
        ("ema_top1", "test top-1, EMA weights"),
    ):
        if row_has(history, key):
            x, y = _series(history, key)
            ax_acc.plot(x, [100 * value for value in y], marker=".", label=label)
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss", title="Loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="Accuracy")
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs only
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def row_has(history: Sequence[dict], key: str) -> bool:
    return any(row.get(key) not in (None, "") for row in history)


def _series(history: Sequence[dict], key: str) -> tuple[list, list]:
    """(epochs, values) of the rows that have `key` (test metrics skip unevaluated epochs)."""
    rows = [row for row in history if row.get(key) not in (None, "")]
    return [row["epoch"] for row in rows], [row[key] for row in rows]


def plot_confusion_matrix(
    confusion: np.ndarray, class_names: Sequence[str], title: str = ""
) -> Figure:
    """A (K, K) confusion matrix (rows: true class, columns: predicted) as a row-normalised
    heatmap; cells are annotated with percentages when K is small enough to read them."""
    confusion = np.asarray(confusion, dtype=np.float64)
    rows = confusion.sum(axis=1, keepdims=True)
    normalised = np.divide(confusion, rows, out=np.zeros_like(confusion), where=rows > 0)
    k = len(class_names)
    side = min(max(5.0, 0.45 * k + 2), 40.0)
    fig = Figure(figsize=(side + 1, side), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="fraction of the true class")
    if k <= 30:
        ax.set_xticks(range(k), class_names, rotation=45, ha="right")
        ax.set_yticks(range(k), class_names)
        for i in range(k):
            for j in range(k):
                value = normalised[i, j]
                color = "white" if value > 0.5 else "black"
                ax.text(
                    j, i, f"{100 * value:.0f}", ha="center", va="center", color=color, fontsize=7
                )
    ax.set(xlabel="predicted class", ylabel="true class", title=title or "Confusion matrix (%)")
    return fig


# -- attention ----------------------------------------------------------------------------------


def denormalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Normalised images (B, C, H, W) or (C, H, W) -> displayable (B, H, W, C) floats in [0, 1]."""
    if images.ndim == 3:
        images = images[None]
    mean_t = torch.as_tensor(mean, dtype=images.dtype, device=images.device).reshape(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=images.dtype, device=images.device).reshape(1, -1, 1, 1)
    pixels = (images.detach() * std_t + mean_t).clamp(0, 1)
    return pixels.permute(0, 2, 3, 1).cpu().numpy()


def heatmap_for_display(heatmap: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """A (gh, gw) map -> (H, W) in [0, 1]: bilinear upsampling, then min-max rescaling.

    A constant map (no contrast to show) becomes all zeros rather than dividing by zero."""
    grid = torch.as_tensor(heatmap, dtype=torch.float32).detach().cpu()
    if grid.ndim != 2:
        raise ValueError(f"heatmap must be (grid_h, grid_w), got shape {tuple(grid.shape)}")
    up = F.interpolate(grid[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    low, high = up.min(), up.max()
    return ((up - low) / (high - low) if high > low else torch.zeros_like(up)).numpy()


def _new_figure(rows: int, cols: int, cell: float = 2.0) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(cell * cols, cell * rows), layout="constrained")
    axes = np.asarray(fig.subplots(rows, cols, squeeze=False))
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return fig, axes


def draw_overlay(
    ax: Axes, image: np.ndarray, heatmap: torch.Tensor, alpha: float = 0.5, cmap: str = "jet"
) -> None:
    """Draw `image` (H, W, C) in [0, 1] with `heatmap` (gh, gw) blended over it on `ax`."""
    ax.imshow(image, interpolation="nearest")
    ax.imshow(heatmap_for_display(heatmap, image.shape[:2]), cmap=cmap, alpha=alpha, vmin=0, vmax=1)


def overlay(
    image: np.ndarray, heatmap: torch.Tensor, title: str | None = None, alpha: float = 0.5
) -> Figure:
    """One heat map (gh, gw) over one image (H, W, C) in [0, 1] (see `denormalize`)."""
    fig, axes = _new_figure(1, 1, cell=3.0)
    draw_overlay(axes[0, 0], image, heatmap, alpha)
    if title:
        axes[0, 0].set_title(title)
    return fig


def plot_explanations(
    images: np.ndarray,
    maps: Mapping[str, torch.Tensor],
    row_titles: Sequence[str] | None = None,
    alpha: float = 0.5,
) -> Figure:
    """Methods side by side: one row per image, the image then one overlay per method.

    images: (B, H, W, C) in [0, 1] (see `denormalize`). maps: method name -> (B, gh, gw).
    row_titles: optional B labels, e.g. "cat (pred dog)".
    """
    batch = len(images)
    for name, values in maps.items():
        if len(values) != batch:
            raise ValueError(f"map {name!r} has {len(values)} entries for {batch} images")
    fig, axes = _new_figure(batch, 1 + len(maps), cell=1.6)
    for i in range(batch):
        axes[i, 0].imshow(images[i], interpolation="nearest")
        if row_titles is not None:
            axes[i, 0].set_ylabel(row_titles[i], fontsize=8)
        for j, (name, values) in enumerate(maps.items(), start=1):
            draw_overlay(axes[i, j], images[i], values[i], alpha)
            if i == 0:
                axes[i, j].set_title(name, fontsize=9)
    axes[0, 0].set_title("image", fontsize=9)
    return fig


def plot_attention_grid(
    attentions: Sequence[torch.Tensor],
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 1,
    image_index: int = 0,
    query: int = 0,
    image: np.ndarray | None = None,
) -> Figure:
    """Attention of one query token to every patch, for each block (rows) and head (columns).

    attentions: depth tensors (B, nh, N, N) as captured by `vit.explain.record_attention`.
    query: the token whose attention is shown (0, the class token, by default; for a model
    without one, token 0 is the top-left patch). With `image` (H, W, C) the maps are overlaid
    on it, otherwise drawn as raw (gh, gw) grids; each panel is rescaled on its own.
    """
    gh, gw = grid_size
    depth, heads = len(attentions), attentions[0].shape[1]
    fig, axes = _new_figure(depth, heads, cell=1.0)
    for layer, attention in enumerate(attentions):
        rows = attention[image_index, :, query, num_prefix_tokens:].reshape(heads, gh, gw)
        for head in range(heads):
            ax = axes[layer, head]
            if image is None:
                ax.imshow(heatmap_for_display(rows[head], (gh, gw)), cmap="viridis")
            else:
                draw_overlay(ax, image, rows[head])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"block {layer}", fontsize=8)
    return fig


def plot_head_attention(
    head_maps: torch.Tensor,
    image: np.ndarray | None = None,
    title: str | None = None,
    columns: int = 7,
    alpha: float = 0.6,
) -> Figure:
    """The DINO picture: one map per head of the last block, for one image.

    head_maps: (nh, gh, gw), e.g. `vit.explain.last_block_attention(model, images)[i]`. With
    `image` (H, W, C) in [0, 1] the image comes first and each head is overlaid on it,
    otherwise the raw grids are drawn. `title` goes above all panels: say there where the
    weights came from. Panels wrap after `columns`; each is rescaled on its own.
    """
    maps = torch.as_tensor(head_maps).detach().cpu()
    if maps.ndim != 3:
        raise ValueError(f"head_maps must be (heads, grid_h, grid_w), got {tuple(maps.shape)}")
    panels = len(maps) + (image is not None)
    cols = min(columns, panels)
    rows = -(-panels // cols)  # ceiling division
    fig, axes = _new_figure(rows, cols, cell=1.6)
    flat = list(axes.flat)
    if image is not None:
        flat.pop(0).imshow(image, interpolation="nearest")
        axes.flat[0].set_title("image", fontsize=8)
    for head, (ax, grid) in enumerate(zip(flat, maps, strict=False)):
        if image is None:
            ax.imshow(heatmap_for_display(grid, tuple(grid.shape)), cmap="viridis")
        else:
            draw_overlay(ax, image, grid, alpha=alpha, cmap="inferno")
        ax.set_title(f"head {head}", fontsize=8)
    for ax in flat[len(maps) :]:
        ax.set_axis_off()  # the unused cells of the last row
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def add_colorbar(fig: Figure, cmap: str = "inferno", label: str = "") -> None:
    """A colour bar for maps drawn in [0, 1] with `cmap` (as `draw_overlay` and
    `plot_head_attention` draw them), beside all of the figure's panels."""
    mappable = ScalarMappable(norm=Normalize(vmin=0, vmax=1), cmap=cmap)
    bar = fig.colorbar(mappable, ax=fig.axes, shrink=0.8, fraction=0.04)
    if label:
        bar.set_label(label, fontsize=8)
    bar.ax.tick_params(labelsize=7)


def plot_attention_distance(distances: torch.Tensor, patch_size: int | None = None) -> Figure:
    """Mean attention distance (pixels) of every head against block depth, as in the ViT paper.

    distances: (depth, nh), e.g. from `vit.explain.model_attention_distance`. One dot per head;
    `patch_size` adds a dashed line at one patch for scale.
    """
    values = torch.as_tensor(distances).detach().cpu().numpy()
    depth, heads = values.shape
    fig = Figure(figsize=(5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for head in range(heads):
        ax.scatter(np.arange(depth), values[:, head], s=14, label=f"head {head}")
    if patch_size is not None:
        ax.axhline(patch_size, color="grey", linestyle="--", linewidth=1, label="one patch")
    ax.set_xlabel("network depth (block)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(np.arange(depth))
    ax.set_ylim(bottom=0)
    if heads <= 12:
        ax.legend(fontsize=6, ncols=2, loc="lower right")
    return fig
