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


def test_the_warm_up_before_a_capture_leaves_every_tensor_as_it_was(monkeypatch):
    """A capture is preceded by one run of the update, undone after: the parameters, the EMA and
    the optimizer's state as they were, bit for bit, also where the update broke off half-way.
    (Undoing it outside no_grad was refused by autograd: on an H200 every capture then failed,
    and the warm-up's update stayed, a step taken twice.) Muon's groups and AdamW's."""
    from vit.training import update_graph

    torch.manual_seed(0)
    model = vit.create_model("vit_cifar_patch4_32", embed_dim=32, depth=1, num_heads=2)
    optimizer = build_optimizer(model, "muon", lr=1e-2, weight_decay=0.1)
    update = UpdateGraph(optimizer, model, ModelEma(model, 0.9), clip_grad=1.0)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    update()  # a first step, so that the state holds values other than zeros
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    grads = [param.grad for param in update.params]
    scalars = torch.tensor(update.scalars(), dtype=torch.float32)  # (S,): this step's numbers

    def snapshot() -> list[torch.Tensor]:
        tensors = [*model.state_dict().values(), *update.ema.module.state_dict().values()]
        for state in update.state:
            tensors += [t for key in update_graph.TENSOR_LISTS for t in state.get(key, [])]
        return [tensor.clone() for tensor in tensors]

    before, params = snapshot(), [param.clone() for param in update.params]
    with update_graph.undone(update.updated_tensors()):  # the warm-up, as capture runs it
        update.apply(grads, scalars)
    assert all(map(torch.equal, snapshot(), before))

    def broken(*args, **kwargs):  # after the weight decay and Muon's momentum moved
        raise RuntimeError("a warm-up broken off half-way (a test's)")

    monkeypatch.setattr(update_graph, "orthogonalize_all", broken)
    warm_up = update_graph.undone(update.updated_tensors())
    with pytest.raises(RuntimeError, match="half-way"), warm_up:
        update.apply(grads, scalars)
    assert all(map(torch.equal, snapshot(), before))
    monkeypatch.undo()
    update.apply(grads, scalars)  # the warm-up's update, kept: it had something to undo
    assert not any(map(torch.equal, update.params, params))
