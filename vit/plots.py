"""Training-curve and confusion-matrix figures (matplotlib, no display needed).

Figures are built with `matplotlib.figure.Figure` rather than pyplot: no global state, no GUI
backend, safe in any process. Files are written atomically (a killed run leaves no half PNG).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .weights import atomic_write


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    return path


def plot_curves(history: Sequence[dict], path: str | Path) -> Path:
    """Loss and accuracy per epoch from metrics rows (keys as in metrics.csv) to a PNG."""
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
    return _save(fig, path)


def row_has(history: Sequence[dict], key: str) -> bool:
    return any(row.get(key) not in (None, "") for row in history)


def _series(history: Sequence[dict], key: str) -> tuple[list, list]:
    """(epochs, values) of the rows that have `key` (test metrics skip unevaluated epochs)."""
    rows = [row for row in history if row.get(key) not in (None, "")]
    return [row["epoch"] for row in rows], [row[key] for row in rows]


def plot_confusion_matrix(
    confusion: np.ndarray, class_names: Sequence[str], path: str | Path, title: str = ""
) -> Path:
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
    return _save(fig, path)
