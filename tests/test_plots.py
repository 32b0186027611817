"""vit.utils.plots: every figure comes back as a matplotlib Figure; save_figure writes it
atomically."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

import vit
from vit.explain import (
    attention_rollout,
    last_block_attention,
    model_attention_distance,
    record_attention,
)
from vit.utils.plots import (
    denormalize,
    heatmap_for_display,
    overlay,
    plot_attention_distance,
    plot_attention_grid,
    plot_confusion_matrix,
    plot_curves,
    plot_explanations,
    plot_head_attention,
    save_figure,
)

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return vit.VisionTransformer(
        img_size=(8, 16), patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3
    ).eval()


def assert_png(fig: Figure, path) -> None:
    assert isinstance(fig, Figure)
    fig.savefig(path)
    with Image.open(path) as saved:
        assert saved.format == "PNG"
        assert saved.size[0] > 50 and saved.size[1] > 50


def test_denormalize_inverts_normalisation():
    pixels = torch.rand(2, 3, 4, 5)
    normalised = (pixels - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    out = denormalize(normalised, MEAN, STD)
    assert out.shape == (2, 4, 5, 3)
    np.testing.assert_allclose(out, pixels.permute(0, 2, 3, 1).numpy(), atol=1e-6)


def test_heatmap_for_display_rescales_and_upsamples():
    shown = heatmap_for_display(torch.tensor([[1.0, 3.0]]), (4, 8))
    assert shown.shape == (4, 8)
    assert shown.min() == 0.0 and shown.max() == 1.0
    assert (shown[:, :2] == 0).all() and (shown[:, -2:] == 1).all()  # left low, right high
    assert (heatmap_for_display(torch.ones(2, 2), (4, 4)) == 0).all()  # constant: no contrast
    with pytest.raises(ValueError, match="grid_h"):
        heatmap_for_display(torch.ones(2, 2, 2), (4, 4))


def test_overlay_and_side_by_side(model, tmp_path):
    images = torch.randn(2, 3, 8, 16)
    pixels = denormalize(images, MEAN, STD)
    maps = attention_rollout(model, images)
    assert_png(overlay(pixels[0], maps[0], title="rollout"), tmp_path / "overlay.png")
    fig = plot_explanations(pixels, {"a": maps, "b": -maps}, row_titles=["x", "y"])
    assert len(fig.axes) == 2 * 3
    assert_png(fig, tmp_path / "side_by_side.png")
    with pytest.raises(ValueError, match="entries"):
        plot_explanations(pixels, {"a": maps[:1]})


@pytest.mark.parametrize("with_image", [False, True])
def test_attention_grid_has_a_panel_per_block_and_head(model, tmp_path, with_image):
    images = torch.randn(1, 3, 8, 16)
    record = record_attention(model, images)
    image = denormalize(images, MEAN, STD)[0] if with_image else None
    fig = plot_attention_grid(record.attentions, model.grid_size, image=image)
    assert len(fig.axes) == 2 * 2
    assert_png(fig, tmp_path / "grid.png")


@pytest.mark.parametrize("with_image", [False, True])
def test_head_attention_has_a_panel_per_head_and_the_weights_label(model, tmp_path, with_image):
    images = torch.randn(1, 3, 8, 16)
    head_maps = last_block_attention(model, images)[0]  # (2 heads, 2, 4)
    image = denormalize(images, MEAN, STD)[0] if with_image else None
    fig = plot_head_attention(head_maps, image=image, title="random weights", columns=2)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.axison]
    assert titles == (["image"] if with_image else []) + ["head 0", "head 1"]
    assert len(fig.axes) == (4 if with_image else 2)  # 3 panels wrap into 2x2, one cell off
    assert fig._suptitle.get_text() == "random weights"
    assert_png(fig, tmp_path / "heads.png")
    with pytest.raises(ValueError, match="heads, grid_h, grid_w"):
        plot_head_attention(head_maps[0])


def test_attention_distance_plot(model, tmp_path):
    distances = model_attention_distance(model, torch.randn(2, 3, 8, 16))
    assert distances.shape == (2, 2)
    # 2x4 grid of 4 px patches: distances lie between 0 and the grid's diagonal
    assert (distances >= 0).all() and (distances <= (4**2 + 12**2) ** 0.5).all()
    fig = plot_attention_distance(distances, patch_size=4)
    assert len(fig.axes[0].collections) == 2  # one scatter per head
    assert_png(fig, tmp_path / "distance.png")


def test_training_figures_are_figures_and_save_atomically(tmp_path):
    """Every plotting function returns a Figure; `save_figure` alone writes, atomically."""
    history = [
        {"epoch": 1, "train_loss": 1.2, "train_acc": 0.4, "test_loss": None, "test_top1": None},
        {"epoch": 2, "train_loss": 0.9, "train_acc": 0.6, "test_loss": 0.8, "test_top1": 0.7},
    ]
    curves = plot_curves(history)
    assert isinstance(curves, Figure)
    assert [len(ax.lines) for ax in curves.axes] == [2, 2]  # loss: train, test; acc: 2 keys
    confusion = plot_confusion_matrix(np.array([[3, 1], [0, 4]]), ["cat", "dog"], title="t")
    assert isinstance(confusion, Figure) and confusion.axes[0].get_title() == "t"
    assert not list(tmp_path.iterdir())  # plotting wrote nothing
    path = save_figure(confusion, tmp_path / "confusion.png")
    assert path == tmp_path / "confusion.png"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    assert_png(curves, tmp_path / "curves.png")
