"""Test-time augmentation (vit.inference.tta): the shifted views, their black border, their mean."""

import numpy as np
import pytest
import torch

import vit
from vit.data.transforms import EvalTransform
from vit.inference.evaluation import evaluate
from vit.inference.tta import black_pixel, log_mean_probability, shift, tta_logits, views

PREPROCESS = vit.Preprocess(
    input_size=(32, 32), crop_pct=1.0, mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26)
)


def moved(images: torch.Tensor, dy: int, dx: int, fill: torch.Tensor) -> torch.Tensor:
    """The reference shift, written another way: copy the overlapping window into a canvas
    of `fill`."""
    B, C, H, W = images.shape
    out = fill.view(1, C, 1, 1).expand(B, C, H, W).clone()
    out[..., max(dy, 0) : H + min(dy, 0), max(dx, 0) : W + min(dx, 0)] = images[
        ..., max(-dy, 0) : H - max(dy, 0), max(-dx, 0) : W - max(dx, 0)
    ]
    return out


def test_black_pixel_is_what_the_evaluation_transform_makes_of_a_black_image():
    black = EvalTransform(PREPROCESS)(np.zeros((32, 32, 3), np.uint8))  # (3, 32, 32)
    assert torch.allclose(black, black_pixel(PREPROCESS).view(3, 1, 1).expand(3, 32, 32))
    assert torch.equal(black_pixel(None), torch.zeros(3))


def test_shift_moves_the_picture_down_and_right_and_fills_the_border_black():
    fill = black_pixel(PREPROCESS)
    images = torch.randn(2, 3, 32, 32)
    for dy, dx in ((2, 0), (0, -2), (-3, 1), (1, 3)):
        out = shift(images, dy, dx, fill)
        assert torch.equal(out, moved(images, dy, dx, fill)), (dy, dx)
    # one bright pixel at (row 5, column 7) lands at (5 + 2, 7 - 1)
    dot = fill.view(1, 3, 1, 1).expand(1, 3, 8, 10).clone()
    dot[..., 5, 7] = 9.0
    out = shift(dot, 2, -1, fill)
    assert (out == 9.0).nonzero()[:, 2:].unique(dim=0).tolist() == [[7, 6]]
    # a black image stays black whichever way it moves
    black = fill.view(1, 3, 1, 1).expand(1, 3, 32, 32)
    assert torch.allclose(shift(black, -2, 2, fill), black)


@pytest.mark.parametrize(("side", "step"), [(32, 2), (224, 14), (8, 1)])
def test_shift_views_move_one_sixteenth_of_the_side_four_ways_and_flips_double_them(side, step):
    fill = black_pixel(PREPROCESS)
    images = torch.randn(1, 3, side, side)
    expected = [images] + [moved(images, dy, dx, fill) for dy, dx in ((0, -step), (0, step))]
    expected += [moved(images, dy, dx, fill) for dy, dx in ((-step, 0), (step, 0))]
    assert all(map(torch.equal, views(images, "shift", fill), expected))
    both = views(images, "flip-shift", fill)
    assert len(both) == 10 and all(map(torch.equal, both[5:], [v.flip(-1) for v in expected]))
    assert len(views(images, "flip", fill)) == 2 and len(views(images, "none", fill)) == 1
    with pytest.raises(ValueError, match="accepted"):
        views(images, "crop", fill)


def test_tta_logits_is_the_mean_softmax_of_the_views_and_the_first_view_is_plain():
    torch.manual_seed(0)
    model = vit.create_model("vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2).eval()
    torch.nn.init.normal_(model.head.weight)
    images, fill = torch.randn(4, 3, 32, 32), black_pixel(PREPROCESS)
    plain, log_probs = tta_logits(model, images, "shift", fill)
    with torch.no_grad():
        probs = torch.stack([model(v).softmax(-1) for v in views(images, "shift", fill)]).mean(0)
        assert torch.equal(plain, model(images))
    assert torch.allclose(log_probs.exp(), probs, atol=1e-6)
    assert torch.allclose(log_mean_probability(plain), plain.log_softmax(-1))


@pytest.mark.parametrize("method", ["flip", "shift", "flip-shift"])
def test_evaluate_reports_the_tta_figures_beside_the_plain_ones(method):
    torch.manual_seed(0)
    model = vit.create_model("vit_cifar_patch4_32", embed_dim=64, depth=2, num_heads=4).eval()
    model.preprocess = PREPROCESS
    torch.nn.init.normal_(model.head.weight)
    images, labels = torch.randn(12, 3, 32, 32), torch.randint(0, 10, (12,))
    loader = [(images[:5], labels[:5]), (images[5:], labels[5:])]
    result = evaluate(model, loader, num_classes=10, device=torch.device("cpu"), tta=method)
    fill = black_pixel(PREPROCESS)
    with torch.no_grad():
        probs = torch.stack([model(v).softmax(-1) for v in views(images, method, fill)]).mean(0)
        plain = model(images)
    accuracy = {
        key: (x.argmax(1) == labels).double().mean().item()
        for key, x in (("plain", plain), ("tta", probs))
    }
    assert result["top1"] == pytest.approx(accuracy["plain"])
    assert result["tta"]["top1"] == pytest.approx(accuracy["tta"])
    expected_loss = torch.nn.functional.nll_loss(probs.log(), labels).item()
    assert result["tta"]["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert not np.isclose(result["tta"]["loss"], result["loss"])  # the views did count
    assert "tta" not in evaluate(model, loader, num_classes=10, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="accepted"):
        evaluate(model, loader, num_classes=10, device=torch.device("cpu"), tta="crop")
