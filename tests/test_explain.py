"""vit.explain: capture, rollout, gradient rollout, relevance and faithfulness, on tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vit
from vit.explain import (
    attention_rollout,
    capture_attention,
    discard_lowest,
    drop_tokens,
    faithfulness,
    gradient_rollout,
    gradient_rollout_matrix,
    last_block_attention,
    mean_attention_distance,
    patch_map,
    perturbation_curve,
    record_attention,
    relevance,
    relevance_matrix,
    remove_patches,
    rollout_matrix,
)

# A hand-computed example: one class token and two patches (a 1x2 grid), two layers.
A1 = [[0.2, 0.6, 0.2], [0.0, 0.5, 0.5], [0.4, 0.0, 0.6]]
A2 = [[0.0, 0.2, 0.8], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
# (A + I) / 2 is already row-stochastic here:
#   a1 = [[.6 .3 .1] [0 .75 .25] [.2 0 .8]],  a2 = [[.5 .1 .4] [.5 .5 0] [.25 .25 .5]]
# and rollout = a2 @ a1, worked out by hand:
ROLLOUT = [[0.38, 0.225, 0.395], [0.3, 0.525, 0.175], [0.25, 0.2625, 0.4875]]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tiny_model(seed: int = 0, **overrides) -> vit.VisionTransformer:
    """A 2-block ViT small enough for CPU tests, with a random (non-zero) head so that
    gradients of the logits are not all zero."""
    torch.manual_seed(seed)
    kwargs = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    model = vit.VisionTransformer(**{**kwargs, **overrides}).eval()
    if isinstance(model.head, torch.nn.Linear):  # not for a headless model (num_classes=0)
        torch.nn.init.normal_(model.head.weight, std=0.5)
    return model


def images_for(model: vit.VisionTransformer, batch: int = 3, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(batch, 3, *model.patch_embed.img_size)


def force_attention(
    model: vit.VisionTransformer, matrices: list[torch.Tensor], pool: torch.Tensor | None = None
):
    """Make block i's softmax output `matrices[i]` (N, N) for every image and head, and the
    attention pool's (global_pool="map") output `pool` (N,).

    A forward hook that returns a value replaces the module's output, and hooks run in
    registration order, so the capture hooks registered later see the forced matrices."""
    softmaxes = [block.attn.softmax for block in model.blocks]
    if pool is not None:
        softmaxes.append(model.attn_pool.softmax)
        matrices = [*matrices, pool]
    handles = []
    for softmax, matrix in zip(softmaxes, matrices, strict=True):

        def hook(_module, _inputs, out, matrix=matrix):
            # out * 0 keeps the forced matrix in the graph, so gradients can still be taken
            return out * 0 + matrix.to(out.dtype)

        handles.append(softmax.register_forward_hook(hook))
    return handles


def random_attention(batch, heads, n, depth, seed=0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.rand(batch, heads, n, n, generator=generator).softmax(dim=-1) for _ in range(depth)
    ]


def numpy_rollout(attentions, head_fusion, discard_ratio, num_prefix):
    """Loop-by-loop reference, image by image, written independently of vit.explain."""
    out = []
    for b in range(attentions[0].shape[0]):
        result = None
        for layer in attentions:
            heads = layer[b].numpy().astype(np.float64)
            a = {"mean": heads.mean, "max": heads.max, "min": heads.min}[head_fusion](axis=0)
            n = a.shape[0]
            k = int(n * (n - num_prefix) * discard_ratio)
            if k:
                candidates = [(a[i, j], i, j) for i in range(n) for j in range(num_prefix, n)]
                for _, i, j in sorted(candidates)[:k]:
                    a[i, j] = 0.0
            a = (a + np.eye(n)) / 2
            a = a / a.sum(axis=1)[:, None]
            result = a if result is None else a @ result
        out.append(result)
    return np.stack(out)


# -- the hand-computed example -----------------------------------------------------------------
def test_rollout_matrix_matches_hand_computation():
    attentions = [torch.tensor(A1)[None, None], torch.tensor(A2)[None, None]]  # (1, 1, 3, 3)
    result = rollout_matrix(attentions, num_prefix_tokens=1)
    torch.testing.assert_close(result[0], torch.tensor(ROLLOUT), rtol=0, atol=1e-6)
    # The class token's row, patches only, is the map: 0.225 and 0.395 on a 1x2 grid.
    assert patch_map(result, (1, 2), 1).flatten().tolist() == pytest.approx([0.225, 0.395])


@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
def test_model_rollout_matches_hand_computation(head_fusion):
    # A 4x8 image in 4x4 patches: a 1x2 grid and three tokens, as in the hand example. Both
    # heads carry the same matrix, so every head fusion gives the same answer.
    model = tiny_model(img_size=(4, 8))
    handles = force_attention(model, [torch.tensor(A1), torch.tensor(A2)])
    try:
        result = attention_rollout(model, images_for(model), head_fusion=head_fusion)
    finally:
        for h in handles:
            h.remove()
    expected = torch.tensor([0.225, 0.395]).expand(3, 1, 2)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-6)


def test_head_fusion_and_discard_match_reference_with_two_prefix_tokens():
    # Two prefix tokens (e.g. class + register) and a 2x3 grid: N = 8.
    attentions = random_attention(batch=3, heads=4, n=8, depth=3)
    for fusion in ("mean", "max", "min"):
        for ratio in (0.0, 0.3, 0.9):
            got = rollout_matrix(attentions, fusion, ratio, num_prefix_tokens=2)
            expected = numpy_rollout(attentions, fusion, ratio, num_prefix=2)
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_relevance_matrix_matches_chefer_recipe_by_hand():
    # One block, one head, a gradient of ones: relevance = I + A, map = A[0, 1:].
    attention = torch.tensor(A1)[None, None]
    result = relevance_matrix([attention], [torch.ones_like(attention)])
    torch.testing.assert_close(result[0], torch.eye(3) + torch.tensor(A1))
    # Two blocks, negative gradients clamp to zero: R = (I + A2)(I + A1) with head 1 dropped.
    a1 = torch.stack([torch.tensor(A1), torch.tensor(A2)])[None]  # (1, 2, 3, 3)
    a2 = torch.stack([torch.tensor(A2), torch.tensor(A1)])[None]
    grad = torch.stack([torch.full((3, 3), 2.0), torch.full((3, 3), -1.0)])[None]
    result = relevance_matrix([a1, a2], [grad, grad])
    cam1 = torch.tensor(A1)  # mean over heads of [2*A1, 0]
    cam2 = torch.tensor(A2)
    r1 = torch.eye(3) + cam1
    torch.testing.assert_close(result[0], r1 + cam2 @ r1)


def test_gradient_rollout_matrix_fuses_then_clamps():
    attention = torch.tensor([A1, A2])[None]  # (1, 2 heads, 3, 3)
    grad = torch.stack([torch.full((3, 3), 1.0), torch.full((3, 3), -3.0)])[None]
    got = gradient_rollout_matrix([attention], [grad])
    fused = ((torch.tensor(A1) - 3 * torch.tensor(A2)) / 2).clamp(min=0)
    a = (fused + torch.eye(3)) / 2
    torch.testing.assert_close(got[0], a / a.sum(dim=-1, keepdim=True))


# -- invariants ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.95])
def test_rollout_rows_sum_to_one(ratio):
    attentions = random_attention(batch=2, heads=3, n=10, depth=4)
    grads = [torch.randn_like(a) for a in attentions]
    for matrix in (
        rollout_matrix(attentions, "max", ratio, num_prefix_tokens=1),
        gradient_rollout_matrix(attentions, grads, "mean", ratio, num_prefix_tokens=1),
    ):
        torch.testing.assert_close(matrix.sum(dim=-1), torch.ones(2, 10))
        assert (matrix >= 0).all()


@pytest.mark.parametrize("attention", ["identity", "zero"])
def test_identity_case_rollout_is_the_residual_path(attention):
    # No token mixing (each token attends only to itself, or all attention discarded to zero):
    # what is left is the residual path, so rollout is the identity for any depth and fusion.
    n = 6
    matrix = torch.eye(n) if attention == "identity" else torch.zeros(n, n)
    attentions = [matrix.expand(2, 3, n, n)] * 4
    for fusion in ("mean", "max", "min"):
        torch.testing.assert_close(rollout_matrix(attentions, fusion), torch.eye(n).expand(2, n, n))
    # Relevance likewise never moves between tokens: R stays diagonal, at least the identity.
    grads = [torch.randn(2, 3, n, n) for _ in attentions]
    result = relevance_matrix(attentions, grads)
    assert (result * (1 - torch.eye(n))).abs().max() == 0
    assert (result.diagonal(dim1=1, dim2=2) >= 1).all()


def test_identity_attention_in_a_model_gives_empty_maps():
    # Forced identity attention: the class token never reads a patch, so every map is zero
    # for a class-token model; for an average-pooled model each patch reads only itself,
    # so the map is uniform, 1 / (number of patches).
    model = tiny_model()
    handles = force_attention(model, [torch.eye(17)] * 2)
    images = images_for(model)
    try:
        for method in (attention_rollout, gradient_rollout, relevance):
            assert method(model, images).abs().max() == 0
    finally:
        for h in handles:
            h.remove()
    model = tiny_model(class_token=False, global_pool="avg")
    handles = force_attention(model, [torch.eye(16)] * 2)
    try:
        result = attention_rollout(model, images)
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(result, torch.full((3, 4, 4), 1 / 16))


def test_discard_is_per_image_and_never_drops_prefix_columns():
    n, prefix = 5, 1
    base = torch.arange(1.0, n * n + 1).reshape(n, n) / 100  # distinct entries
    a = torch.stack([base, base.flip(-1)])  # image 1 ranks columns the other way round
    a[1, :, 0] = 0.0  # image 1's class column holds the smallest values of all
    out = discard_lowest(a, 0.5, prefix)
    k = int(n * (n - prefix) * 0.5)
    for b in range(2):
        assert torch.equal(out[b, :, :prefix], a[b, :, :prefix])  # class column untouched
        dropped = (out[b] == 0) & (a[b] != 0)
        assert dropped.sum() == k
        # the dropped entries are exactly the k smallest of the candidates of *this* image
        candidates = a[b, :, prefix:].flatten().sort().values
        assert a[b][dropped].max() <= candidates[k - 1]
    assert not torch.equal(out[0] == 0, out[1] == 0)


# -- capture -------------------------------------------------------------------------------------
def test_capture_does_not_change_logits_and_restores_fused_setting():
    model = tiny_model()
    images = images_for(model)
    with torch.no_grad():
        fused_logits = model(images)
    record = record_attention(model, images)
    torch.testing.assert_close(record.logits, fused_logits, rtol=1e-5, atol=1e-5)
    assert all(block.attn.fused_attn for block in model.blocks)
    assert len(record.attentions) == 2
    for a in record.attentions:
        assert a.shape == (3, 2, 17, 17)
        torch.testing.assert_close(a.sum(dim=-1), torch.ones(3, 2, 17))
    # A model that was on the explicit path stays there.
    model.set_fused_attn(False)
    record_attention(model, images)
    assert not any(block.attn.fused_attn for block in model.blocks)


def test_capture_cleans_up_after_an_error_and_captures_while_fused():
    model = tiny_model()
    model.train()
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(model) as attentions:
            model(images_for(model))
            assert len(attentions) == 2  # captured although the model defaults to fused
            raise RuntimeError("boom")
    assert all(block.attn.fused_attn for block in model.blocks)
    assert all(not block.attn.softmax._forward_hooks for block in model.blocks)
    # record_attention runs in eval mode and gives the caller's mode back
    record_attention(model, images_for(model))
    assert model.training


def test_gradients_are_paired_with_their_own_block():
    model = tiny_model(depth=3)
    images = images_for(model)
    record = record_attention(model, images, with_gradients=True)
    # Independent computation: retain_grad on each block's probabilities, in forward order.
    kept = []

    def keep(_m, _i, out):
        out.retain_grad()
        kept.append(out)

    model.set_fused_attn(False)
    handles = [b.attn.softmax.register_forward_hook(keep) for b in model.blocks]
    logits = model(images)
    logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    for h in handles:
        h.remove()
    for got, tensor in zip(record.gradients, kept, strict=True):
        torch.testing.assert_close(got, tensor.grad)
    # Only the class token's output of the last block reaches the head, so the last block's
    # gradient is zero on every other query row; an earlier block's is not.
    assert record.gradients[-1][:, :, 1:].abs().max() == 0
    assert record.gradients[-1][:, :, 0].abs().max() > 0
    assert record.gradients[0][:, :, 1:].abs().max() > 0


# -- batches, shapes, targets --------------------------------------------------------------------
# Every family's switches (timm's names), on the tiny model: the explanations must hold for each.
FAMILIES = {
    "square": {},
    "non-square": {"img_size": (8, 24), "patch_size": (4, 8)},  # non-square patches: 2x3 grid
    "no-class-token": {"class_token": False, "global_pool": "avg"},
    "dinov2": {"init_values": 1e-5},  # LayerScale
    "dinov2-registers": {"init_values": 0.1, "reg_tokens": 4, "no_embed_class": True},
    "clip": {"pre_norm": True, "act_layer": "quick_gelu"},
    "siglip": {"class_token": False, "global_pool": "map", "act_layer": "gelu_tanh"},
    "deit-distilled": {"distilled": True},
    "deit3": {"init_values": 1e-4, "no_embed_class": True},
    "registers-avg": {"reg_tokens": 2, "class_token": False, "global_pool": "avg"},
}


def family_model(name: str, seed: int = 0) -> vit.VisionTransformer:
    """The tiny model with a family's switches; LayerScale at 1 so blocks do mix the tokens,
    and random heads (the distillation head too)."""
    model = tiny_model(seed, **FAMILIES[name])
    with torch.no_grad():
        for name_, parameter in model.named_parameters():
            if name_.endswith("gamma"):
                parameter.fill_(1.0)
            if name_.startswith("head_dist.weight"):
                torch.nn.init.normal_(parameter, std=0.5)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_batch_equals_single_images(family):
    model = family_model(family)
    images = images_for(model, batch=3)
    methods = {
        "rollout": lambda x: attention_rollout(model, x, "max", discard_ratio=0.5),
        "gradient rollout": lambda x: gradient_rollout(model, x, discard_ratio=0.3),
        "relevance": lambda x: relevance(model, x),
        "last block, head 1": lambda x: last_block_attention(model, x)[:, 1],
    }
    for name, method in methods.items():
        batched = method(images)
        assert batched.shape == (3, *model.grid_size), name
        singles = torch.cat([method(images[i : i + 1]) for i in range(3)])
        torch.testing.assert_close(batched, singles, rtol=1e-4, atol=1e-6, msg=name)
        assert batched.abs().sum() > 0, name


def test_class_targets():
    model = tiny_model()
    images = images_for(model, batch=4)
    with torch.no_grad():
        predicted = model(images).argmax(1)
    for method in (gradient_rollout, relevance):
        default = method(model, images)
        torch.testing.assert_close(default, method(model, images, target=predicted))
        other = (predicted + 1) % 5
        chosen = method(model, images, target=other)
        assert not torch.allclose(default, chosen)
        torch.testing.assert_close(method(model, images, target=2), method(model, images, [2] * 4))
    with pytest.raises(ValueError, match="out of range"):
        relevance(model, images, target=5)
    with pytest.raises(ValueError, match="entries"):
        relevance(model, images, target=[0, 1])


def test_class_targets_by_name():
    """A class named as `model.class_names` names it equals its index; a name the model does
    not have, or a model without names, is one clear ValueError (it was torch's "new():
    invalid data type 'str'")."""
    model = tiny_model()
    model.class_names = ["cat", "dog", "ship", "frog", "bird"]
    images = images_for(model, batch=2)
    for method in (gradient_rollout, relevance):
        torch.testing.assert_close(method(model, images, "ship"), method(model, images, 2))
        torch.testing.assert_close(
            method(model, images, ["dog", "cat"]), method(model, images, [1, 0])
        )
    with pytest.raises(ValueError, match="'horse' is not one of the model's classes: cat, dog"):
        relevance(model, images, target="horse")
    model.class_names = None
    with pytest.raises(ValueError, match="no class names"):
        relevance(model, images, target="cat")


def test_one_image_without_its_batch_dimension_is_named():
    model = tiny_model()
    image = images_for(model, batch=1)[0]  # (C, H, W)
    for call in (model, lambda x: attention_rollout(model, x)):
        with pytest.raises(ValueError, match=r"expected a batch of images \(B, C, H, W\)"):
            call(image)


def test_raw_pixels_are_refused_not_classified():
    """uint8 images (torchvision.io.read_image's) were cast to float and classified as 0-255
    values: logits of nothing, where timm's conv refuses the dtype. Float64 is cast, as before."""
    model = tiny_model().eval()
    pixels = torch.randint(0, 256, (1, 3, *model.patch_embed.img_size), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"expected float images.*got torch.uint8.*create_trans"):
        model(pixels)
    with torch.no_grad():
        x = images_for(model, batch=1)
        torch.testing.assert_close(model(x.double()), model(x))


def test_bad_arguments_are_named():
    attentions = random_attention(1, 1, 5, 1)
    with pytest.raises(ValueError, match="head_fusion"):
        rollout_matrix(attentions, "median")
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout_matrix(attentions, discard_ratio=1.0)
    with pytest.raises(ValueError, match="prefix"):
        patch_map(rollout_matrix(attentions), (2, 3), 1)


# -- attention distance --------------------------------------------------------------------------
def test_mean_attention_distance_by_hand():
    # 1x2 grid of 4x4 patches with a class token. Head 0: each patch looks only at the other
    # (4 px away); head 1: patches split evenly between themselves and the other (2 px), and
    # the class-token column is ignored after renormalising over the patches.
    head0 = torch.tensor([[1.0, 0, 0], [0, 0, 1], [0, 1, 0]])
    head1 = torch.tensor([[1.0, 0, 0], [0.5, 0.25, 0.25], [0.0, 0.5, 0.5]])
    attention = torch.stack([head0, head1])[None]  # (1, 2, 3, 3)
    distance = mean_attention_distance([attention, attention], (1, 2), (4, 4), 1)
    torch.testing.assert_close(distance, torch.tensor([[4.0, 2.0], [4.0, 2.0]]))


# -- faithfulness --------------------------------------------------------------------------------
def test_remove_patches_blanks_the_ranked_patches():
    images = torch.ones(2, 3, 4, 8)
    scores = torch.tensor([[[0.9, 0.1]], [[0.2, 0.7]]])  # (B, 1, 2): 4x4 patches
    most = remove_patches(images, scores, 0.5, most_relevant=True)
    assert most[0, :, :, :4].abs().sum() == 0 and (most[0, :, :, 4:] == 1).all()
    assert most[1, :, :, 4:].abs().sum() == 0 and (most[1, :, :, :4] == 1).all()
    least = remove_patches(images, scores, 0.5, most_relevant=False)
    assert torch.equal(least + most, images)
    assert remove_patches(images, scores, 1.0, True).abs().sum() == 0


def test_patches_that_leave_a_margin_blank_their_own_pixels_and_keep_the_margin():
    """38 px in 16-px patches (so400m's 384 in 14s): a 2 x 2 grid over 32 px, a 6-px margin
    that no patch sees and no removal blanks."""
    images = torch.ones(1, 3, 38, 38)
    scores = torch.tensor([[[0.9, 0.1], [0.2, 0.3]]])  # (B, 2, 2)
    most = remove_patches(images, scores, 0.25, most_relevant=True, patch_size=(16, 16))
    assert most[0, :, :16, :16].abs().sum() == 0
    most[0, :, :16, :16] = 1
    assert (most == 1).all()
    assert (remove_patches(images, scores, 1.0, True, patch_size=(16, 16))[..., 32:] == 1).all()


def test_perturbation_curves_and_area():
    model = tiny_model()
    images = images_for(model, batch=6)
    with torch.no_grad():
        predicted = model(images).argmax(1)
        blank_prediction = model(torch.zeros_like(images)).argmax(1)
    scores = torch.rand(6, 4, 4)
    curve = perturbation_curve(model, images, predicted, scores, positive=True)
    assert curve.shape == (11,)
    assert curve[0] == 1.0  # nothing removed: labels are the model's own predictions
    assert curve[-1] == (blank_prediction == predicted).float().mean()  # everything removed
    result = faithfulness(model, images, predicted, scores, fractions=(0.0, 0.5, 1.0), batch_size=4)
    assert result.positive_curve.shape == result.negative_curve.shape == (3,)
    c = result.positive_curve
    assert result.positive_auc == pytest.approx(float((c[0] + 2 * c[1] + c[2]) / 4))
    assert 0.0 <= result.negative_auc <= 1.0
    # the shared end points (nothing / everything removed) match a direct negative curve
    direct = perturbation_curve(model, images, predicted, scores, False, (0.0, 0.5, 1.0))
    torch.testing.assert_close(result.negative_curve, direct)


def test_faithfulness_script_prints_a_table(tmp_path, capsys, monkeypatch):
    # The benchmark end to end on a tiny saved model and a tiny image folder.
    import importlib.util

    from PIL import Image

    classes = [f"class{i}" for i in range(3)]
    generator = np.random.default_rng(0)
    for name in classes:
        (tmp_path / "test" / name).mkdir(parents=True)
        for j in range(2):
            pixels = generator.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "test" / name / f"{j:04d}.jpg")
    model = tiny_model(num_classes=3)
    model.preprocess = vit.Preprocess(input_size=(16, 16), crop_pct=1.0)
    weights = vit.save_weights(model, tmp_path / "tiny.safetensors", class_names=classes)

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "faithfulness.py"
    monkeypatch.syspath_prepend(str(path.parent))  # its own helpers (_cli.py) beside it
    spec = importlib.util.spec_from_file_location("faithfulness_benchmark", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--weights", str(weights), "--data", str(tmp_path / "test"), "--num-images", "6"]
    script.main([*args, "--threads", "1"])

    out = capsys.readouterr().out
    assert "6 CIFAR-10 test images" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "AUC" not in line]
    assert len(rows) == 6  # random baseline + five methods
    for row in rows:
        positive, negative = (float(cell) for cell in row.strip("|").split("|")[1:])
        assert 0.0 <= positive <= 1.0 and 0.0 <= negative <= 1.0


# -- readouts, registers, directions, per-head maps ----------------------------------------------
def test_patch_map_with_readout_weights_by_hand():
    # Weights over the 3 tokens read the matrix's rows in that mixture: 1/2 on the class and
    # 1/2 on the second prefix token (a distilled model), or an attention pool's weights.
    matrix = torch.tensor(ROLLOUT)[None]  # (1, 3, 3)
    halves = torch.tensor([0.5, 0.5, 0.0])
    expected = 0.5 * (torch.tensor(ROLLOUT[0]) + torch.tensor(ROLLOUT[1]))[1:]
    torch.testing.assert_close(patch_map(matrix, (1, 2), 1, halves).flatten(), expected)
    pool = torch.tensor([[0.2, 0.3, 0.5]])  # (B, N)
    expected = (pool @ torch.tensor(ROLLOUT))[0, 1:]
    torch.testing.assert_close(patch_map(matrix, (1, 2), 1, pool).flatten(), expected)
    # one-hot on token 0 is the "token" readout
    one_hot = torch.tensor([1.0, 0.0, 0.0])
    torch.testing.assert_close(patch_map(matrix, (1, 2), 1, one_hot), patch_map(matrix, (1, 2), 1))


def test_avg_readout_of_a_class_token_model_averages_the_patch_rows_only():
    """An average-pooled head with a class token kept (an MAE backbone fine-tuned with avg
    pooling) reads the patch tokens only: the class token's row is no part of its map."""
    matrix = torch.eye(5)[None].clone()  # (1, 5, 5): each patch reads only itself
    matrix[0, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])  # the class token reads patch 0
    expected = torch.full((1, 2, 2), 0.25)  # mean of the 4 patch rows, on the patch columns
    torch.testing.assert_close(patch_map(matrix, (2, 2), 1, "avg"), expected, rtol=0, atol=0)
    # end to end: a 2x2-patch model with a class token and avg pooling, attention forced
    model = tiny_model(img_size=(8, 8), global_pool="avg")
    assert model.num_prefix_tokens == 1
    layers = random_attention(batch=1, heads=1, n=5, depth=2, seed=3)
    rolled = rollout_matrix(layers, num_prefix_tokens=1)[0]  # (5, 5)
    expected = rolled[1:].mean(dim=0)[1:].reshape(1, 2, 2)
    torch.testing.assert_close(
        run_forced(model, [a[0, 0] for a in layers]), expected.expand(2, 2, 2)
    )


def test_drop_tokens_removes_rows_and_columns_and_renormalises():
    a = torch.tensor(A1)[None, None]  # (1, 1, 3, 3): drop token 1 (a "register")
    got = drop_tokens(a, [1])
    kept = torch.tensor([[0.2, 0.2], [0.4, 0.6]])  # rows 0, 2 and columns 0, 2 of A1
    torch.testing.assert_close(got[0, 0], kept / kept.sum(dim=1, keepdim=True))
    torch.testing.assert_close(drop_tokens(a, [1], renormalize=False)[0, 0], kept)
    # a readout's (B, nh, L, N) attention loses the column only
    pool = torch.tensor([[[[0.1, 0.6, 0.3]]]])
    torch.testing.assert_close(drop_tokens(pool, [1]), torch.tensor([[[[0.25, 0.75]]]]))


def test_dropping_registers_nobody_attends_to_changes_nothing():
    # If no token attends to token 1, rolling out without it gives the same map: the matrix
    # shrinks by one row and column, the map over the patches is identical.
    attentions = random_attention(batch=2, heads=3, n=7, depth=3, seed=4)
    for a in attentions:
        a[..., 1] = 0.0
        a /= a.sum(dim=-1, keepdim=True)
    full = rollout_matrix(attentions, num_prefix_tokens=2)
    without = rollout_matrix([drop_tokens(a, [1]) for a in attentions], num_prefix_tokens=1)
    assert full.shape == (2, 7, 7) and without.shape == (2, 6, 6)
    torch.testing.assert_close(without.sum(dim=-1), torch.ones(2, 6))
    torch.testing.assert_close(patch_map(full, (1, 5), 2), patch_map(without, (1, 5), 1))


def test_direction_along_a_head_row_explains_that_class():
    # With the dot product, the similarity to head.weight[c] is logit c minus its bias: the
    # same gradients, so the same maps as explaining class c.
    model = tiny_model()
    images = images_for(model, batch=3)
    for c in (0, 3):
        row = model.head.weight[c].detach()
        for method in (gradient_rollout, relevance):
            by_class = method(model, images, target=c)
            by_direction = method(model, images, direction=row, similarity="dot")
            torch.testing.assert_close(by_direction, by_class, rtol=1e-5, atol=1e-7)
    record = record_attention(model, images, direction=model.head.weight[0], similarity="dot")
    torch.testing.assert_close(record.scores, (record.embeddings @ model.head.weight[0].detach()))
    assert record.logits is None and record.embeddings.shape == (3, 32)


def test_cosine_direction_explains_a_headless_backbone():
    model = tiny_model(num_classes=0)  # model(x) is the pooled embedding
    images = images_for(model, batch=3)
    embeddings = vit.explain.embed(model, images)  # (B, D)
    with torch.no_grad():
        torch.testing.assert_close(embeddings, model(images))
    reference = embeddings[0]  # explain the other images' similarity to image 0
    record = record_attention(model, images, direction=reference)
    cosine = torch.nn.functional.cosine_similarity(embeddings, reference[None], dim=-1)
    torch.testing.assert_close(record.scores, cosine)
    assert record.scores[0] == pytest.approx(1.0)
    for method in (gradient_rollout, relevance):
        batched = method(model, images, direction=reference)
        per_image = method(model, images, direction=reference.expand(3, -1))
        torch.testing.assert_close(batched, per_image)
        singles = torch.cat(
            [method(model, images[i : i + 1], direction=reference) for i in range(3)]
        )
        torch.testing.assert_close(batched, singles, rtol=1e-4, atol=1e-7)
        assert batched[1:].abs().sum() > 0
        # cosine is scale free: the same map for a rescaled direction; the dot product is not
        torch.testing.assert_close(method(model, images, direction=5 * reference), batched)
        dot = method(model, images, direction=reference, similarity="dot")
        assert not torch.allclose(dot, batched)
    with pytest.raises(ValueError, match="no classifier head"):
        relevance(model, images)
    with pytest.raises(ValueError, match=r"direction has shape \(7,\)"):
        relevance(model, images, direction=torch.ones(7))
    with pytest.raises(ValueError, match="similarity"):
        relevance(model, images, direction=reference, similarity="euclid")


def test_a_direction_in_the_heads_output_space_explains_a_clip_text_similarity():
    """A CLIP model's head is its image projection, into the space of its text embeddings:
    with pre_logits=False the direction is read there (a text embedding of the head's width
    was refused, the embeddings taken before the head)."""
    model = tiny_model(num_classes=16)  # the head as a projection 32 -> 16
    images = images_for(model, batch=3)
    text = torch.randn(16)  # a text embedding: the projection's width, not the tower's
    with pytest.raises(ValueError, match=r"direction has shape \(16,\).*pre_logits=False"):
        relevance(model, images, direction=text)
    projected = vit.explain.embed(model, images, pre_logits=False)
    with torch.no_grad():
        torch.testing.assert_close(projected, model(images))
    record = record_attention(model, images, direction=text, pre_logits=False)
    cosine = torch.nn.functional.cosine_similarity(projected, text[None], dim=-1)
    torch.testing.assert_close(record.scores, cosine)
    # the dot product with the projection's input-side direction is the same score: equal maps
    through_head = model.head.weight.detach().T @ text  # (32,): text . (W e + b) - text . b
    for method in (gradient_rollout, relevance):
        projected_map = method(model, images, direction=text, similarity="dot", pre_logits=False)
        torch.testing.assert_close(
            projected_map, method(model, images, direction=through_head, similarity="dot")
        )
        assert projected_map.shape == (3, *model.grid_size)


def test_class_target_and_direction_are_not_mixed_up():
    model = tiny_model()
    images = images_for(model, batch=2)
    with pytest.raises(ValueError, match="not both"):
        gradient_rollout(model, images, target=1, direction=torch.ones(32))
    with pytest.raises(ValueError, match="direction="):
        gradient_rollout(model, images, target=torch.ones(2))  # floats are not class indices


@pytest.mark.parametrize("class_token", [True, False])
def test_last_block_attention_is_each_heads_readout_row(class_token):
    overrides = {} if class_token else {"class_token": False, "global_pool": "avg"}
    model = tiny_model(num_heads=4, img_size=(8, 16), **overrides)  # a 2x4 grid
    images = images_for(model, batch=3)
    maps = last_block_attention(model, images)
    assert maps.shape == (3, 4, 2, 4)
    last = record_attention(model, images).attentions[-1]  # (B, nh, N, N)
    if class_token:
        # DINO's picture: attentions[:, :, 0, 1:], and with the class column the row sums to 1
        torch.testing.assert_close(maps, last[:, :, 0, 1:].reshape(3, 4, 2, 4))
        torch.testing.assert_close(maps.sum(dim=(-2, -1)) + last[:, :, 0, 0], torch.ones(3, 4))
    else:
        torch.testing.assert_close(maps, last.mean(dim=2).reshape(3, 4, 2, 4))
        torch.testing.assert_close(maps.sum(dim=(-2, -1)), torch.ones(3, 4))
    singles = torch.cat([last_block_attention(model, images[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(maps, singles, rtol=1e-5, atol=1e-7)


def test_maps_follow_the_input_grid_of_a_dynamic_size_model():
    model = tiny_model(dynamic_img_size=True)  # made for 16x16 (4x4 grid), fed 8x12 (2x3)
    torch.manual_seed(0)
    images = torch.randn(2, 3, 8, 12)
    for method in (attention_rollout, gradient_rollout, relevance):
        assert method(model, images).shape == (2, 2, 3)
    assert last_block_attention(model, images).shape == (2, 2, 2, 3)


# -- the families' readouts, by hand ---------------------------------------------------------------
def run_forced(model, matrices, pool=None, method=attention_rollout, **kwargs):
    handles = force_attention(model, matrices, pool)
    try:
        return method(model, images_for(model, batch=2), **kwargs)
    finally:
        for h in handles:
            h.remove()


def test_distilled_maps_read_the_mean_of_class_and_distillation_rows():
    # A 4x8 image in 4x4 patches with class + distillation token: N = 4, two forced layers.
    model = tiny_model(img_size=(4, 8), distilled=True)
    assert model.num_prefix_tokens == 2
    layers = random_attention(batch=1, heads=1, n=4, depth=2, seed=5)
    matrices = [a[0, 0] for a in layers]
    rolled = rollout_matrix(layers, num_prefix_tokens=2)[0]  # (4, 4)
    expected = ((rolled[0] + rolled[1]) / 2)[2:].reshape(1, 2)
    torch.testing.assert_close(run_forced(model, matrices), expected.expand(2, 1, 2))
    heads = run_forced(model, matrices, method=last_block_attention)  # (B, nh, 1, 2)
    last = matrices[-1]
    expected = ((last[0] + last[1]) / 2)[2:].reshape(1, 1, 2)
    torch.testing.assert_close(heads, expected.expand(2, 2, 1, 2))


def test_attention_pool_maps_weight_the_rollout_rows_by_the_pools_attention():
    # SigLIP: no class token, an attention pool reads the tokens. With the pool's attention
    # forced to w, the rollout map is (w @ rollout)[patches]; the last-block map per head is
    # w @ A_last; relevance with the pool reads w-weighted rows of R.
    model = tiny_model(img_size=(4, 8), class_token=False, global_pool="map")
    assert model.num_prefix_tokens == 0
    layers = random_attention(batch=1, heads=1, n=2, depth=2, seed=6)
    matrices = [a[0, 0] for a in layers]
    w = torch.tensor([0.25, 0.75])
    rolled = rollout_matrix(layers, num_prefix_tokens=0)[0]
    got = run_forced(model, matrices, pool=w)
    torch.testing.assert_close(got, (w @ rolled).reshape(1, 1, 2).expand(2, 1, 2))
    heads = run_forced(model, matrices, pool=w, method=last_block_attention)
    torch.testing.assert_close(heads, (w @ matrices[-1]).reshape(1, 1, 1, 2).expand(2, 2, 1, 2))
    # the pool's attention is captured like a block's, rows summing to one
    record = record_attention(model, images_for(model), with_gradients=True)
    assert record.pool_attention.shape == (3, 2, 1, 2)
    torch.testing.assert_close(record.pool_attention.sum(-1), torch.ones(3, 2, 1))
    assert record.pool_gradient.shape == (3, 2, 1, 2) and record.pool_gradient.abs().sum() > 0
    assert all(block.attn.fused_attn for block in model.blocks) and model.attn_pool.fused_attn


def test_registers_can_be_left_out_of_the_maps():
    # class + 2 registers + a 1x2 grid: N = 5, the registers are tokens 1 and 2.
    model = tiny_model(img_size=(4, 8), reg_tokens=2)
    assert model.num_prefix_tokens == 3
    layers = random_attention(batch=1, heads=1, n=5, depth=2, seed=7)
    matrices = [a[0, 0] for a in layers]
    kept = [drop_tokens(a, [1, 2]) for a in layers]  # (1, 1, 3, 3) each, rows renormalised
    with_registers = rollout_matrix(layers, num_prefix_tokens=3)[0]
    without = rollout_matrix(kept, num_prefix_tokens=1)[0]
    assert without.shape == (3, 3)
    torch.testing.assert_close(without.sum(-1), torch.ones(3))
    got = run_forced(model, matrices)
    torch.testing.assert_close(got, with_registers[0, 3:].reshape(1, 1, 2).expand(2, 1, 2))
    got = run_forced(model, matrices, include_registers=False)
    torch.testing.assert_close(got, without[0, 1:].reshape(1, 1, 2).expand(2, 1, 2))
    heads = run_forced(model, matrices, method=last_block_attention, include_registers=False)
    torch.testing.assert_close(heads, kept[-1][0, 0, 0, 1:].reshape(1, 1, 1, 2).expand(2, 2, 1, 2))
    # with the registers left out, the class row over class + patches sums to one
    torch.testing.assert_close(heads.sum(dim=(-2, -1)) + kept[-1][0, 0, 0, 0], torch.ones(2, 2))
    # gradient methods too: real attention, both settings, maps of the grid's size, different
    model = family_model("dinov2-registers")
    images = images_for(model)
    for method in (attention_rollout, gradient_rollout, relevance):
        full, bare = method(model, images), method(model, images, include_registers=False)
        assert full.shape == bare.shape == (3, 4, 4)
        assert not torch.allclose(full, bare)


def test_a_model_without_pooling_is_refused_with_the_reason():
    model = tiny_model(num_classes=0, global_pool="")  # forward_head returns every token
    with pytest.raises(ValueError, match="global_pool=''.*'token', 'avg' or 'map'"):
        attention_rollout(model, images_for(model))


# -- captured attention equals the source's ------------------------------------------------------
def test_captured_pool_attention_is_the_latent_querys_softmax_by_hand():
    # SigLIP's readout: softmax(q(latent) . k(tokens) / sqrt(hs)) per head, from the pool's own
    # weights and the final tokens, computed here independently of the model's forward.
    model = family_model("siglip")
    images = images_for(model)
    record = record_attention(model, images)
    pool = model.attn_pool
    with torch.no_grad():
        tokens = model.forward_features(images)  # (B, N, D)
        heads, size = pool.num_heads, 32 // pool.num_heads
        q = pool.q(pool.latent).reshape(heads, size)  # (nh, hs)
        k = pool.kv(tokens)[..., :32].reshape(3, -1, heads, size)  # (B, N, nh, hs)
        expected = torch.einsum("hd,bnhd->bhn", q, k).mul(size**-0.5).softmax(-1)[:, :, None]
    torch.testing.assert_close(record.pool_attention, expected, rtol=1e-5, atol=1e-6)


DINOV2_FOLDER = Path(__file__).resolve().parents[2] / "shared" / "data" / "dinov2-small"


@pytest.mark.slow
def test_real_dinov2_attention_equals_transformers_own():
    """The DINO picture on real weights: every block's captured attention, and so the per-head
    last-block maps, equal transformers' Dinov2Model(output_attentions=True) on the same image."""
    if not DINOV2_FOLDER.is_dir():
        pytest.skip(f"the shared DINOv2 folder is not at {DINOV2_FOLDER}")
    from transformers import Dinov2Model

    model = vit.load_model(DINOV2_FOLDER)
    theirs = Dinov2Model.from_pretrained(DINOV2_FOLDER, attn_implementation="eager").eval()
    torch.manual_seed(0)
    images = torch.randn(2, 3, 224, 224)
    record = record_attention(model, images)
    with torch.no_grad():
        reference = theirs(pixel_values=images, output_attentions=True).attentions
    assert len(record.attentions) == len(reference) == 12
    for ours, their in zip(record.attentions, reference, strict=True):
        torch.testing.assert_close(ours, their, rtol=1e-4, atol=2e-5)
    heads = last_block_attention(model, images)  # (2, 6, 16, 16)
    torch.testing.assert_close(
        heads, reference[-1][:, :, 0, 1:].reshape(2, 6, 16, 16), rtol=1e-4, atol=2e-5
    )
