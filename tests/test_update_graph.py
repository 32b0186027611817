"""--graph-update through train.py, and a parameter it cannot update (its refusal of float16
is in tests/test_user_errors.py). That its steps are the eager update's
(weights, EMA, optimizer state) is tests/test_gpu.py's test_update_graph_takes_the_eager_
updates_steps, on the CPU and on CUDA."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_resumes_exactly
from safetensors.torch import load_file

import vit
from vit.training.ema import ModelEma
from vit.training.optimizers import build_optimizer
from vit.training.update_graph import UpdateGraph

MUON = ("--opt", "muon", "--muon-lr", "3e-3", "--graph-update")


def test_train_py_trains_with_it_and_resumes_exactly(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """A run with --graph-update, killed after its first checkpoint and resumed, ends with
    the uninterrupted run's weights bit for bit, and within rounding of the eager run's."""
    reference = assert_resumes_exactly(train_script, monkeypatch, tmp_path, image_folder, *MUON)
    eager = tmp_path / "eager"
    assert train_script.main(tiny_args(image_folder, eager, 2, *MUON[:-1])) == 0
    ours, theirs = (
        load_file(reference / "model.safetensors"),
        load_file(eager / "model.safetensors"),
    )
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-4, atol=2e-5, msg=key)


def test_a_parameter_without_a_gradient_is_named_before_anything_moves():
    model = vit.create_model("vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2)
    optimizer = build_optimizer(model, "muon", lr=1e-3, weight_decay=0.1)
    update = UpdateGraph(optimizer, model, ModelEma(model, 0.9), clip_grad=1.0)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    model.head.bias.grad = None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"head\.bias got no gradient"):
        update()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert update.ema.updates == 0
