"""--graph-step on the CPU: through train.py it takes --graph-update's steps to the bit and
resumes exactly; nothing in the step it captures reads a value back to the host (which a CUDA
graph's capture refuses) or takes a tensor from the CPU (which a graph would replay as it was
when captured); more than one process is refused (its other refusals are in
tests/test_user_errors.py). Its CUDA cases, the captured step against the uncaptured one, a
refused capture and a capture made again, are in tests/test_gpu.py."""

from __future__ import annotations

import pytest
import torch
from conftest import CLASSES, Dispatched, assert_resumes_exactly
from safetensors.torch import load_file
from test_gpu import engine_run

from vit.training import build, engine
from vit.training.settings import TrainConfig
from vit.training.step_graph import StepGraph
from vit.utils.process_group import DistInfo

MUON = ("--opt", "muon", "--muon-lr", "3e-3")
# What reads a tensor's value back to the host: .item(), float(), bool() and the ops whose
# output's size depends on the values. In a capture each is an error, or worse, a value read
# once and replayed as a constant.
HOST_READS = {
    "aten._local_scalar_dense",
    "aten.nonzero",
    "aten.masked_select",
    "aten.is_nonzero",
    "aten.equal",
    "aten._unique2",
}


def test_train_py_takes_graph_updates_steps_to_the_bit_and_resumes_exactly(
    image_folder, tmp_path, train_script, tiny_args, monkeypatch
):
    """A run with --graph-step, killed after its first checkpoint and resumed, ends with the
    uninterrupted run's weights, and those are --graph-update's run's bit for bit (on a CPU
    both take the same arithmetic: the step's graph changes where it runs, not what)."""
    flags = (*MUON, "--cutmix", "1.0", "--drop-path", "0.1")
    stepped = assert_resumes_exactly(
        train_script, monkeypatch, tmp_path, image_folder, *flags, "--graph-step"
    )
    updated = tmp_path / "graph-update"
    assert train_script.main(tiny_args(image_folder, updated, 2, *flags, "--graph-update")) == 0
    for name in ("model.safetensors", "best.safetensors"):
        ours, theirs = load_file(stepped / name), load_file(updated / name)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs), name
    eager = tmp_path / "eager"  # and not the same as no graph at all: the test can fail
    assert train_script.main(tiny_args(image_folder, eager, 2, *flags)) == 0
    plain = load_file(eager / "model.safetensors")
    ours = load_file(stepped / "model.safetensors")
    assert not all(torch.equal(ours[key], plain[key]) for key in plain)


def speedrun_step_run() -> build.Run:
    """The engine's pieces for the GPU speedrun's step at a tiny size: Muon (its Newton-Schulz
    in bfloat16), AdamW for the rest, clipping, the EMA, stochastic depth, patch dropout,
    CutMix's soft targets, bfloat16 autocast; --graph-step."""
    return engine_run(
        torch.device("cpu"),
        opt="muon",
        muon_ns_dtype="bfloat16",
        clip_grad=1.0,
        model_ema=True,
        drop_path=0.1,
        patch_drop=0.5,
        cutmix=1.0,
        amp=True,
        graph_step=True,
        warmup_epochs=0.5,
    )


def test_the_step_it_captures_reads_nothing_back_to_the_host():
    """Everything `StepGraph.step` runs (the forward pass, the loss on soft targets, the
    backward pass, clipping, Muon and AdamW, the EMA), watched op by op on the CPU: no value
    read back to the host. The watch itself sees such a read (float() of the loss, a read the
    training loop makes every 25 steps, outside the step)."""
    run = speedrun_step_run()
    run.model.train()
    images = torch.randn(8, 3, 32, 32)
    images, targets = engine.mixed(run, images, torch.arange(8) % len(CLASSES))
    scalars = torch.tensor(run.update.scalars(), dtype=torch.float32)
    before = run.model.head.weight.clone()
    with Dispatched() as watched:
        logits, loss = run.step.step(images, targets, scalars)
    names = set(watched.names)
    assert {"aten.bmm", "aten.addmm", "aten._foreach_norm"} <= names  # Muon, the model, clipping
    assert len(watched.names) > 300 and not names & HOST_READS, names & HOST_READS
    assert logits.shape == (8, len(CLASSES)) and torch.isfinite(loss)
    assert not torch.equal(run.model.head.weight, before)  # it stepped
    with Dispatched() as watched:
        float(loss)
    assert "aten._local_scalar_dense" in watched.names


def test_the_step_it_captures_mixes_no_host_tensor_into_the_devices():
    """The same step on the meta device (shapes, no values): no operation takes a tensor from
    the CPU, which on a GPU is a copy each step or, for a 0-d one (torch lets it in as a
    number read at launch), a value a CUDA graph would replay as a constant (as torch's AdamW
    keeps its step counts unless `capturable`). Reading a value would fail here too. The watch
    sees a 0-d CPU tensor mixed in."""
    meta = torch.device("meta")
    settings = dict(clip_grad=1.0, model_ema=True, drop_path=0.1, patch_drop=0.5)
    run = engine_run(meta, opt="muon", graph_step=True, **settings)
    # autocast knows no meta device; off (no --amp), the CPU's changes nothing either
    forward_loss = build.build_forward_loss(run.model, run.cfg, torch.device("cpu"), True)
    step = StepGraph(forward_loss, run.model, run.update)
    run.model.train()
    images, targets = torch.empty(8, 3, 32, 32, device=meta), torch.empty(8, 3, device=meta)
    scalars = torch.tensor(run.update.scalars(), dtype=torch.float32).to(meta)
    with Dispatched() as watched:
        logits, loss = step.step(images, targets, scalars)
    assert logits.shape == (8, len(CLASSES)) and loss.device == meta
    assert len(watched.names) > 300 and watched.with_cpu_tensors == []
    ones, two = torch.ones(2, device=meta), torch.tensor(2.0)
    with Dispatched() as watched:
        ones * two
    assert watched.with_cpu_tensors == ["aten.mul"]


def test_more_than_one_process_is_refused_before_anything_is_built():
    cfg = TrainConfig(graph_step=True, device="cpu")
    with pytest.raises(ValueError, match=r"--graph-step with 2 processes: .* one process"):
        build.start(cfg, DistInfo(rank=0, world_size=2), torch.device("cpu"), saver=None)
