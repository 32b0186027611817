"""--grad-accum-steps and --grad-checkpointing (timm's flags): an optimizer step over several
batches gives the step over one batch of all their images, in one process and under torchrun;
recomputed activations give the same weights as kept ones; neither goes with a step graph."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_close_weights, assert_resumes_exactly, tiny_train_args
from torch.utils.checkpoint import checkpoint

from vit.models import vision_transformer
from vit.training import build, engine
from vit.training.build import optimizer_steps
from vit.training.settings import TrainConfig, check_settings
from vit.utils.process_group import DistInfo

ROOT = Path(__file__).resolve().parents[1]

# Nothing drawn per batch that a batch's size would change (flips, crop offsets, mixing,
# dropped paths): a batch of 16 and two of 8 then see the same pixels.
SAME_PIXELS = ("--batch-augment", "--hflip", "0", "--crop-pad", "0", "--drop-path", "0")


def test_an_epochs_last_step_takes_the_batches_left():
    cfg = TrainConfig(grad_accum_steps=4)
    assert [optimizer_steps(cfg, batches) for batches in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert optimizer_steps(TrainConfig(), 9) == 9


def tiny_run(cfg: TrainConfig, train_loader=None, steps_per_epoch: int = 1) -> build.Run:
    """A one-block model of 3 classes on the CPU, set up for the epoch loop as train.py does."""
    cpu, info = torch.device("cpu"), DistInfo()
    torch.manual_seed(0)
    model = build.build_training_model(cfg, ["a", "b", "c"])
    state = build.build_training_state(cfg, model, steps_per_epoch, device=cpu, info=info)
    train_model = build.wrap_model(model, cfg, info, cpu)
    forward_loss = build.build_forward_loss(train_model, cfg, cpu, soft_targets=False)
    return build.Run(
        cfg=cfg, info=info, device=cpu, model=model, train_model=train_model,
        forward_loss=forward_loss, train_loader=train_loader, test_loader=None, state=state,
        mixup=None, num_images=0,
    )  # fmt: skip


def test_accumulated_gradients_are_the_mean_over_all_the_batches_images():
    """The gradient two batches of 8 leave is the gradient of one batch of 16 (the mean
    loss's): Muon and AdamW hardly see a gradient's scale, so a sum would train on as well."""
    cfg = TrainConfig(model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2}, drop_path=0.0)
    run = tiny_run(cfg)
    model = run.model
    images, labels = torch.randn(16, 3, 32, 32), torch.arange(16) % 3
    _, loss = run.forward_loss(images, labels)
    loss.backward()
    whole = [p.grad.clone() for p in model.parameters()]
    for part in range(2):
        half = slice(8 * part, 8 * part + 8)
        engine.accumulate_gradients(run, images[half], labels[half], part=part, parts=2)
    for p, expected in zip(model.parameters(), whole, strict=True):
        torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-7)


def test_the_batches_left_after_an_epochs_last_full_accumulation_step_with_their_mean_gradient():
    """6 batches of 4 with --grad-accum-steps 4: two optimizer steps, the second over the two
    batches left, its gradient their 8 images' mean-loss gradient (not half of it, as a
    divisor of 4 would make it)."""
    cfg = TrainConfig(
        model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2}, drop_path=0.0,
        grad_accum_steps=4, mixup=0.0, cutmix=0.0, model_ema=False, clip_grad=None,
    )  # fmt: skip
    batches = [(torch.randn(4, 3, 32, 32), torch.arange(4) % 3) for _ in range(6)]
    run = tiny_run(cfg, train_loader=batches, steps_per_epoch=2)
    model = run.model
    steps = []  # at each optimizer step: (the head's bias gradient, the weights it steps from)

    def record(optimizer, args, kwargs):
        steps.append((model.head.bias.grad.clone(), copy.deepcopy(model.state_dict())))

    run.state.optimizer.register_step_pre_hook(record)
    engine.train_one_epoch(run, 0)
    assert len(steps) == 2 and run.state.scheduler.last_epoch == 2
    grad, weights = steps[1]
    model.load_state_dict(weights)
    model.zero_grad()
    images, labels = (torch.cat(parts) for parts in zip(*batches[4:], strict=True))  # (8, ...)
    run.forward_loss(images, labels)[1].backward()
    assert grad.abs().max() > 1e-3  # a gradient to compare
    torch.testing.assert_close(grad, model.head.bias.grad, rtol=1e-4, atol=1e-6)


def test_two_batches_of_8_accumulated_step_as_one_batch_of_16(image_folder, tmp_path, train_script):
    """48 images: 3 steps of 16, or 6 batches of 8 in 3 steps of 2; the same schedule, the
    same mean gradient a step (to float rounding), and two epochs, so that the second
    epoch's shuffle and the EMA come along."""
    runs = {}
    for name, flags in (
        ("one", ("--batch-size", "16")),
        ("two", ("--batch-size", "8", "--grad-accum-steps", "2")),
        ("alone", ("--batch-size", "8")),
    ):
        runs[name] = tmp_path / name
        args = tiny_train_args(image_folder, runs[name], 2, *SAME_PIXELS, *flags)
        assert train_script.main(args) == 0
    one, two, alone = runs["one"], runs["two"], runs["alone"]
    assert_close_weights(one / "model.safetensors", two / "model.safetensors", atol=1e-5)
    # not the same run by chance: each step of 8 alone trains other weights
    with pytest.raises(AssertionError):
        assert_close_weights(one / "model.safetensors", alone / "model.safetensors", atol=1e-3)


def test_a_killed_run_resumes_exactly_with_a_last_step_of_the_batches_left(
    image_folder, tmp_path, train_script, monkeypatch
):
    """6 batches of 8 an epoch in steps of 4: a step of 4 batches and one of the 2 left."""
    flags = ("--grad-accum-steps", "4")
    assert_resumes_exactly(train_script, monkeypatch, tmp_path, image_folder, *flags)


def test_recomputed_activations_train_the_same_weights(
    image_folder, tmp_path, train_script, monkeypatch
):
    """--grad-checkpointing runs every block through torch.utils.checkpoint in training, with
    stochastic depth's draws replayed in the recomputation: the same weights, bit for bit."""
    kept, recomputed = tmp_path / "kept", tmp_path / "recomputed"
    assert train_script.main(tiny_train_args(image_folder, kept, 1, "--drop-path", "0.1")) == 0
    calls = []

    def counted(function, *args, **kwargs):
        calls.append(function)
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(vision_transformer, "checkpoint", counted)
    flags = ("--drop-path", "0.1", "--grad-checkpointing")
    assert train_script.main(tiny_train_args(image_folder, recomputed, 1, *flags)) == 0
    assert len(calls) == 2 * 6  # 2 blocks, 6 batches of 8
    assert_close_weights(kept / "model.safetensors", recomputed / "model.safetensors", atol=0)


def test_under_torchrun_the_processes_exchange_an_accumulated_steps_gradients(
    image_folder, tmp_path
):
    """Two processes, each two batches of 4 a step, exchanging gradients on the second only,
    train the weights of two processes taking one batch of 8 each a step."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    runs = {}
    for name, flags in (
        ("one", ("--batch-size", "8")),
        ("two", ("--batch-size", "4", "--grad-accum-steps", "2")),
    ):
        runs[name] = tmp_path / name
        args = tiny_train_args(image_folder, runs[name], 1, *SAME_PIXELS, *flags)
        command = [*torchrun, "--nproc_per_node", "2", str(ROOT / "train.py"), *args]
        done = subprocess.run(command, env=env, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert_close_weights(runs["one"] / "model.safetensors", runs["two"] / "model.safetensors", 1e-5)


@pytest.mark.parametrize("flag", ["graph_update", "graph_step"])
def test_accumulation_is_refused_beside_a_step_graph_in_one_line(flag):
    with pytest.raises(ValueError, match="--grad-accum-steps 2: the graph runs a whole"):
        check_settings(TrainConfig(grad_accum_steps=2, **{flag: True}))
