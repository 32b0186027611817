"""The GPU path, over a `device` parameter: every test runs on the CPU here (the same code path
with "cpu") and on CUDA where there is a GPU (its case is skipped, with the reason, elsewhere).

    pytest -m gpu                        # all of them (scripts/gpu_check.sh runs this on a GPU)
    pytest -m gpu --collect-only -q      # what there is

Each test compares with something that would differ on a real fault: timm's logits, a float32
reference, an uninterrupted run, the same run on the CPU, the kernel the profiler saw.
Tolerances, where not exact, are stated beside each test with why they hold.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    CLASSES,
    RTOL,
    assert_close_weights,
    read_rows,
    relative_error,
    stop_after_first_save,
)
from safetensors.torch import load_file
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.models.cnn_teacher import CnnTeacher
from vit.training import build, engine
from vit.training.settings import TrainConfig
from vit.training.teacher_recipe import RECIPES
from vit.utils.process_group import DistInfo

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
NO_CUDA = "CUDA is not available here (torch.cuda.is_available() is False)"

pytestmark = pytest.mark.gpu

# The model of the engine-level tests: the CIFAR geometry, small enough for seconds on a CPU;
# head dim 32, which the flash and memory-efficient kernels take.
TINY = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, num_classes=3)
# the model's size, and (for the speedrun's recipe, which distils) a teacher of seconds
TINY_KWARGS = (
    *("--teacher-width", "4", "--teacher-epochs", "1"),
    *("--model-kwargs", "depth=2", "embed_dim=64", "num_heads=2"),
)

# bf16 autocast against the float32 reference, relative to the largest logit: bf16 keeps 8 bits
# of mantissa (rounding 2^-9 = 2e-3 per operand); measured on this CPU with TINY: 4e-3 to
# 1.5e-2 over six seeds. CUDA's bf16 matrix products accumulate in float32 as the CPU's do, so
# the same bound holds there; 5e-2 leaves room and still fails a model run in float16 that
# overflows or a wrong dtype cast (an error of order 1).
BF16_TOLERANCE = 5e-2
# Our bf16 logits against timm's bf16 logits: the same operations in the same order under the
# same autocast, so they agree far closer than either does with float32 (measured: 0 on CPU).
BF16_SAME_OPS = 1e-2


def _device_param(name: str):
    marks = [pytest.mark.skipif(not CUDA, reason=NO_CUDA)] if name == "cuda" else []
    return pytest.param(name, marks=marks, id=name)


DEVICES = [_device_param("cpu"), _device_param("cuda")]


@contextlib.contextmanager
def float32_in_float32():
    """float32 matrix products and convolutions in float32 on CUDA: TF32 (10 bits of mantissa,
    cuDNN's default for convolutions such as the patch embedding) would be a 1e-3 error."""
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """The device, TF32 off; on the CPU with one thread (tiny models gain nothing from more,
    and lose much on shared cores)."""
    previous = torch.get_num_threads()
    if request.param == "cpu":
        torch.set_num_threads(1)
    with float32_in_float32():
        yield torch.device(request.param)
    torch.set_num_threads(previous)


def tiny_pair(seed: int = 0) -> tuple[vit.VisionTransformer, TimmViT]:
    """Our model and timm's with the same (random, head included) weights, in eval mode."""
    torch.manual_seed(seed)
    theirs = TimmViT(**TINY).eval()
    torch.nn.init.normal_(theirs.head.weight, std=0.5)  # logits with signal, not ~0
    ours = vit.VisionTransformer(**TINY).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def device_args(device: torch.device) -> list[str]:
    """train.py flags for a tiny, deterministic run on `device` (one thread on the CPU, where
    the thread count changes the order of float sums). No stochastic depth: its masks come
    from the device's generator, so a run on CUDA and one on the CPU would train on different
    masks (per-image augmentation, MixUp and CutMix draw on the CPU either way:
    `test_mixup_cutmix_on_the_device_draws_as_on_the_cpu`; --batch-augment draws on the device,
    `test_batches_on_the_device_are_crops_and_flips_of_their_images`). No MixUp or CutMix: the
    tiny runs learn in two epochs without them."""
    threads = ["--threads", "1"] if device.type == "cpu" else []
    no_draws = ["--mixup", "0", "--cutmix", "0", "--drop-path", "0"]
    return ["--device", str(device), *threads, *no_draws]


# Across runs on a GPU (resume, another device), weights agree up to rounding amplified by Adam:
# its step is ~lr wherever a gradient is pure rounding noise (the key part of the qkv bias, whose
# true gradient is zero), so those are compared at lr x steps (3e-3 x 12), the others at `atol`:
# 1e-4 on one GPU, 1e-3 between a GPU and the CPU (other kernels, other sums), both below what a
# lost optimizer state or schedule does in these 12 steps (several steps of lr 3e-3).
LR_STEPS = 3e-3 * 12


def assert_weights_within_rounding(a: Path, b: Path, atol: float) -> None:
    wa, wb = load_file(a), load_file(b)
    for key in wa:
        tolerance = LR_STEPS if key.endswith("qkv.bias") else atol
        assert torch.allclose(wa[key], wb[key], rtol=0, atol=tolerance), key


# -- equivalence with timm on the device ---------------------------------------------------------
def test_float32_logits_match_timm_on_device(device):
    ours, theirs = (m.to(device) for m in tiny_pair())
    x = torch.randn(4, 3, 32, 32, device=device)
    with torch.no_grad():
        reference = theirs(x)
        ours.set_fused_attn(True)
        fused = ours(x)
        ours.set_fused_attn(False)
        explicit = ours(x)
    assert fused.device.type == device.type and fused.dtype == torch.float32
    assert relative_error(fused.cpu(), reference.cpu()) <= RTOL
    assert relative_error(explicit.cpu(), reference.cpu()) <= RTOL


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_autocast_logits_match_timm_within_tolerance(device, seed):
    ours, theirs = (m.to(device) for m in tiny_pair(seed))
    x = torch.randn(8, 3, 32, 32, device=device)
    with torch.no_grad():
        reference = theirs(x).float()  # float32
        with torch.autocast(device.type, dtype=torch.bfloat16):
            ours_bf16, theirs_bf16 = ours(x), theirs(x)
    assert ours_bf16.dtype == torch.bfloat16  # autocast reached the head: the run was bf16
    error = relative_error(ours_bf16.float().cpu(), reference.cpu())
    assert 0 < error <= BF16_TOLERANCE  # > 0: not silently float32
    assert relative_error(ours_bf16.float().cpu(), theirs_bf16.float().cpu()) <= BF16_SAME_OPS


# -- training steps through the engine ----------------------------------------------------------
def engine_run(device: torch.device, **settings) -> build.Run:
    """What train.py's epoch loop works with, around the TINY model on `device`, without data
    (the tests feed batches themselves): constant learning rate, no MixUp, no EMA unless
    asked."""
    options = dict(
        model_kwargs={k: TINY[k] for k in ("depth", "embed_dim", "num_heads")},
        epochs=1,
        warmup_epochs=0,
        lr=3e-3,
        min_lr=3e-3,
        mixup=0.0,
        cutmix=0.0,
        drop_path=0.0,
        model_ema=False,
        device=str(device),
    )
    cfg = TrainConfig(**{**options, **settings})
    info = DistInfo()
    torch.manual_seed(0)
    model = build.build_training_model(cfg, list(CLASSES))
    # a zero head gives no gradient below it; drawn on the CPU, so every device starts alike
    torch.nn.init.normal_(model.head.weight, std=0.02)
    model.to(device)
    state = build.build_training_state(cfg, model, steps_per_epoch=8, device=device, info=info)
    train_model = build.wrap_model(model, cfg, info, device)
    mixup = build.build_mixup(cfg, len(CLASSES))
    teacher = None
    if cfg.distillation_type != "none":  # a random teacher, drawn on the CPU: alike everywhere
        teacher = CnnTeacher(
            len(CLASSES),
            width=4,
            channel_mult=cfg.teacher_channel_mult,
            stem=cfg.teacher_stem,
            **RECIPES[cfg.teacher_recipe].network,  # airbench's: pool before norm, logits x1/9
        )
        teacher = teacher.to(device).eval().requires_grad_(False)
    forward_loss = build.build_forward_loss(
        train_model, cfg, device, soft_targets=mixup is not None, teacher=teacher
    )
    update = build.build_update(cfg, state)
    return build.Run(
        cfg=cfg,
        info=info,
        device=device,
        model=model,
        train_model=train_model,
        forward_loss=forward_loss,
        train_loader=None,
        test_loader=None,
        state=state,
        mixup=mixup,
        num_images=0,
        update=update,
        step=build.build_step(cfg, forward_loss, model, update),
    )


def fixed_batch(device: torch.device, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(size, 3, 32, 32, generator=generator)
    labels = torch.randint(0, len(CLASSES), (size,), generator=generator)
    return images.to(device), labels.to(device)


def train_steps(run: build.Run, steps: int) -> list[float]:
    """`steps` optimizer steps on one fixed batch, through the engine; the losses."""
    images, labels = fixed_batch(run.device)
    run.train_model.train()
    losses = []
    for _ in range(steps):
        _, loss, _ = engine.train_step(run, images, labels)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_amp_steps_follow_float32_training(device, dtype):
    """--amp: the forward runs in `dtype` (logits in it, loss in float32), the gradient scaler is
    on for float16 only, and six steps on one batch track float32 training (within 5% of its
    loss at each step: low precision moves the trajectory a little, a broken cast or a skipped
    update moves it a lot) and learn the batch."""
    reference = train_steps(engine_run(device), 6)
    run = engine_run(device, amp=True, amp_dtype=dtype)
    images, labels = fixed_batch(device)
    logits, loss = engine.forward_loss(run, images, labels)
    assert logits.dtype == getattr(torch, dtype) and loss.dtype == torch.float32
    assert run.state.scaler.is_enabled() is (dtype == "float16")
    # the CPU trains under autocast through the explicit attention (its fused backward is slow
    # in bf16: vit.training.build.wrap_model); a GPU keeps the fused kernels
    fused = {block.attn.fused_attn for block in run.model.blocks}
    assert fused == {device.type != "cpu"}
    losses = train_steps(run, 6)
    assert losses == pytest.approx(reference, rel=5e-2)
    assert losses[-1] < 0.85 * losses[0]  # it learns the batch
    if dtype == "float16":
        assert run.state.scaler.get_scale() == 2.0**16  # no overflow: the scale never dropped


def test_float16_overflow_skips_the_step_and_lowers_the_scale(device):
    """An overflowing float16 step (inf gradients) leaves the weights and the optimizer as
    they were and halves the loss scale; the next finite step trains."""
    run = engine_run(device, amp=True, amp_dtype="float16", clip_grad=1.0)
    images, labels = fixed_batch(device)
    before = copy.deepcopy(run.model.state_dict())
    _, loss = engine.forward_loss(run, images, labels)
    engine.optimizer_step(run.state, loss * 1e38, clip_grad=1.0)  # x 65536: inf in float32
    assert run.state.scaler.get_scale() == 2.0**15
    for key, value in run.model.state_dict().items():
        assert torch.equal(value, before[key]), key  # skipped: not one weight moved
    assert not run.state.optimizer.state  # AdamW never stepped: no moments
    _, loss = engine.forward_loss(run, images, labels)
    engine.optimizer_step(run.state, loss, clip_grad=1.0)
    assert run.state.scaler.get_scale() == 2.0**15
    moved = [k for k, v in run.model.state_dict().items() if not torch.equal(v, before[k])]
    assert "head.weight" in moved and "blocks.0.attn.qkv.weight" in moved


def assert_the_same_steps(eager, other) -> None:
    """Two TrainingStates after the same steps: the same weights, EMA and optimizer state, to
    float rounding (the bound: test_update_graph_takes_the_eager_updates_steps's docstring)."""
    pairs = [
        (eager.model.state_dict(), other.model.state_dict()),
        (eager.ema.module.state_dict(), other.ema.module.state_dict()),
        *zip(
            eager.optimizer.state_dict()["state"].values(),
            other.optimizer.state_dict()["state"].values(),
            strict=True,
        ),
    ]
    for ours, theirs in pairs:
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert theirs[key].dtype == value.dtype and theirs[key].device == value.device, key
            torch.testing.assert_close(theirs[key], value, rtol=1e-4, atol=2e-5, msg=key)


@pytest.mark.parametrize("opt", ["muon", "adamw"])
def test_update_graph_takes_the_eager_updates_steps(device, opt):
    """--graph-update: gradient clipping, the optimizer's step and the EMA, replayed as one
    CUDA graph on a GPU (on the CPU the same arithmetic, as it is), take the eager update's six
    steps under a changing learning rate: the same weights, EMA and optimizer state, to float
    rounding. The bound, 2e-5: the update's own formulas round differently (1e-8 after one
    step), and AdamW turns rounding noise into steps where a gradient is zero but for it (the
    key bias's): measured on a Xeon CPU, 1.0e-6 for Muon, 1.5e-6 for AdamW; the weight decay
    alone moves the weights 5.5e-4 in these six steps. Clipping is on at every step: the run
    without it ends far from both."""
    settings = dict(opt=opt, model_ema=True, model_ema_decay=0.9, clip_grad=0.05, min_lr=1e-4)
    settings.update(weight_decay=0.5)  # so that a missing or doubled decay shows
    settings.update(epochs=2, warmup_epochs=0.5)  # 4 steps of warmup, then the cosine
    runs = {
        "eager": engine_run(device, **settings),
        "graph": engine_run(device, **settings, graph_update=True),
        "unclipped": engine_run(device, **{**settings, "clip_grad": None}),
    }
    assert runs["graph"].update is not None and runs["eager"].update is None
    for run in runs.values():
        train_steps(run, 6)
    assert (runs["graph"].update.graph is not None) is (device.type == "cuda")  # captured
    eager, compiled = runs["eager"].state, runs["graph"].state
    assert compiled.ema.updates == eager.ema.updates == 6
    assert compiled.scheduler.last_epoch == 6
    assert_the_same_steps(eager, compiled)
    unclipped = runs["unclipped"].model.state_dict()
    moved = max((unclipped[k] - v).abs().max().item() for k, v in eager.model.state_dict().items())
    assert moved > 1e-3


@pytest.mark.parametrize("switch", [0.0, 1.0], ids=["mixup", "cutmix"])
def test_mixup_cutmix_on_the_device_draws_as_on_the_cpu(device, switch):
    """The recipe's MixUp / CutMix on a batch on the device: the same draws (the CPU's RNG, so
    a resumed or CPU run mixes alike) and the same soft-target loss as on the CPU."""
    losses = {}
    for where in (device, torch.device("cpu")):
        run = engine_run(where, mixup=0.8, cutmix=1.0, mixup_switch_prob=switch)
        images, labels = fixed_batch(where)
        torch.manual_seed(3)
        mixed, targets = run.mixup(images, labels)
        assert mixed.device.type == targets.device.type == where.type
        assert torch.allclose(targets.sum(dim=1).cpu(), torch.ones(len(labels)))
        assert not torch.equal(mixed, images)  # mixed, not passed through
        torch.manual_seed(3)
        losses[where.type] = engine.forward_loss(run, images, labels)[1].item()
    assert losses[device.type] == pytest.approx(losses["cpu"], rel=1e-5)


def test_ema_lives_on_the_device_and_averages_each_step(device):
    run = engine_run(device, model_ema=True, model_ema_decay=0.9)
    ema = run.state.ema
    expected = {k: v.detach().double().cpu() for k, v in ema.module.state_dict().items()}
    images, labels = fixed_batch(device)
    run.train_model.train()
    for step in range(1, 4):
        _, loss = engine.forward_loss(run, images, labels)
        engine.optimizer_step(run.state, loss, clip_grad=None)
        decay = min(0.9, (1 + step) / (10 + step))  # ModelEma's warmup
        for key, value in run.model.state_dict().items():
            if value.dtype.is_floating_point:
                expected[key] += (value.detach().double().cpu() - expected[key]) * (1 - decay)
    for key, value in ema.module.state_dict().items():
        assert value.device.type == device.type, key
        if value.dtype.is_floating_point:
            assert torch.allclose(value.double().cpu(), expected[key], atol=1e-6), key
    assert not torch.equal(ema.module.head.weight, run.model.head.weight)  # it lags


@pytest.mark.slow  # torch.compile: ~40 s of compilation on a CPU (its C++ compiler)
@pytest.mark.parametrize("cutmix", [0.0, 1.0], ids=["labels", "cutmix-soft-targets"])
def test_compiled_steps_match_eager_steps(device, cutmix):
    """--compile: model and loss in one graph train as the eager steps do, on label-smoothed
    labels and on CutMix's soft targets (the speedrun's loss; the boxes drawn outside the
    graph, from the same seed for both)."""
    eager = engine_run(device, cutmix=cutmix)
    compiled = engine_run(device, compile=True, cutmix=cutmix)
    assert hasattr(compiled.forward_loss, "_torchdynamo_orig_callable")  # torch.compile's
    torch.manual_seed(7)
    eager_losses = train_steps(eager, 3)
    torch.manual_seed(7)
    assert train_steps(compiled, 3) == pytest.approx(eager_losses, rel=1e-4)
    # Fused kernels sum in another order; Adam turns that into up to ~3% of a step (lr 3e-3)
    # where a gradient is tiny, a whole step where it is rounding noise (the qkv key bias).
    weights = eager.model.state_dict()
    for key, value in compiled.model.state_dict().items():  # plain names: no `_orig_mod.`
        atol = LR_STEPS if key.endswith("qkv.bias") else 1e-4
        assert torch.allclose(value, weights[key], rtol=0, atol=atol), key


@pytest.mark.slow  # torch.compile: a minute of compilation and CUDA graph capture
def test_cuda_graph_steps_match_eager_steps(device):
    """--compile-mode reduce-overhead: the step's forward and backward replayed as CUDA graphs
    train as the eager steps do (the same bound as plain --compile's)."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU (on a CPU reduce-overhead compiles as default)")
    eager = engine_run(device)
    graphed = engine_run(device, compile=True, compile_mode="reduce-overhead")
    assert train_steps(graphed, 5) == pytest.approx(train_steps(eager, 5), rel=1e-4)


@pytest.mark.slow  # torch.compile: a minute of compilation and CUDA graph capture
def test_update_graph_beside_the_compiled_steps_cuda_graphs(device):
    """The speedrun's combination: the forward and backward replayed as CUDA graphs
    (reduce-overhead) and the update captured as one more, which train as the same compiled
    steps with the eager update do (the same bound as reduce-overhead's own)."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU (on a CPU reduce-overhead compiles as default)")
    settings = dict(compile=True, compile_mode="reduce-overhead", opt="muon", model_ema=True)
    eager_update = engine_run(device, **settings)
    graphed = engine_run(device, **settings, graph_update=True)
    assert train_steps(graphed, 5) == pytest.approx(train_steps(eager_update, 5), rel=1e-4)
    assert graphed.update.graph is not None


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_update_graph_runs_uncaptured_where_cuda_refuses_the_capture(monkeypatch, caplog):
    """A capture CUDA refuses: one warning, the warm-up's update undone, that step taken
    uncaptured and the next ones by the eager update (the eager run's steps, within the bound
    of the captured ones)."""
    from vit.training import update_graph

    def refused():
        raise RuntimeError("operation not permitted when stream is capturing (a test's)")

    monkeypatch.setattr(update_graph.torch.cuda, "CUDAGraph", refused)
    device = torch.device("cuda")
    settings = dict(opt="muon", model_ema=True, model_ema_decay=0.9, clip_grad=0.05)
    eager, uncaptured = (
        engine_run(device, **settings),
        engine_run(device, **settings, graph_update=True),
    )
    with caplog.at_level("WARNING", logger="vit"):
        train_steps(eager, 3)
        train_steps(uncaptured, 3)
    assert uncaptured.update.graph is None and not uncaptured.update.capturable
    assert [r.message for r in caplog.records if "could not be captured" in r.message] != []
    assert_the_same_steps(eager.state, uncaptured.state)


def test_after_a_refused_capture_the_eager_update_takes_the_steps(monkeypatch):
    """Once CUDA refused the update's capture (`capturable` False), the training loop takes the
    eager update (the uncaptured function was a third slower on the H200): the same steps, on
    the CPU too."""
    cpu = torch.device("cpu")
    settings = dict(opt="muon", model_ema=True, model_ema_decay=0.9, clip_grad=0.05)
    eager, refused = engine_run(cpu, **settings), engine_run(cpu, **settings, graph_update=True)
    train_steps(refused, 1)  # on a GPU, the step whose capture failed: the function, uncaptured
    refused.update.capturable = False

    def not_called(*args):
        raise AssertionError("the uncaptured update ran after the capture was refused")

    monkeypatch.setattr(refused.update, "apply", not_called)
    train_steps(eager, 3)
    train_steps(refused, 2)  # the same fixed batch: 3 steps in all, as the eager run's
    assert_the_same_steps(eager.state, refused.state)


@pytest.mark.parametrize("opt", ["muon", "adamw"])
def test_step_graph_takes_the_update_graphs_steps(device, opt):
    """--graph-step: the forward pass, the loss, the backward pass and --graph-update's update,
    replayed as one CUDA graph on a GPU (on the CPU the same arithmetic, as it is), take the
    steps --graph-update takes, under a changing learning rate: on the CPU the same to the bit,
    on a GPU to the bound of test_update_graph_takes_the_eager_updates_steps (the kernels are
    the same; their inputs' addresses and the backward's order of accumulation may not be)."""
    settings = dict(opt=opt, model_ema=True, model_ema_decay=0.9, clip_grad=0.05, min_lr=1e-4)
    settings.update(weight_decay=0.5, epochs=2, warmup_epochs=0.5)
    updated = engine_run(device, **settings, graph_update=True)
    stepped = engine_run(device, **settings, graph_step=True)
    assert stepped.step is not None and updated.step is None
    losses = {"updated": train_steps(updated, 6), "stepped": train_steps(stepped, 6)}
    assert (stepped.step.captured is not None) is (device.type == "cuda")
    assert stepped.step.capturable and stepped.update.graph is None  # the step's graph only
    assert stepped.state.ema.updates == 6 and stepped.state.scheduler.last_epoch == 6
    if device.type == "cpu":
        assert losses["stepped"] == losses["updated"]
        for ours, theirs in [
            (stepped.model.state_dict(), updated.model.state_dict()),
            (stepped.state.ema.module.state_dict(), updated.state.ema.module.state_dict()),
        ]:
            assert all(torch.equal(value, theirs[key]) for key, value in ours.items())
    assert losses["stepped"] == pytest.approx(losses["updated"], rel=1e-4)
    assert_the_same_steps(updated.state, stepped.state)


@pytest.mark.parametrize(
    ("kind", "stem", "tta"),
    [("hard", "conv", "none"), ("soft", "whiten", "none"), ("soft", "whiten", "flip")],
)
def test_step_graph_takes_the_teacher_into_its_graph(device, kind, stem, tta):
    """--distillation-type: the frozen teacher's forward pass is part of the step (a CUDA
    graph's on a GPU), and the step takes --graph-update's steps with it (on the CPU to the
    bit); the teacher's loss changes the steps (a teacher left out would not). Either stem:
    the whitening stem's 2x2 convolution too (airbench's stages and recipe, the speedrun's
    teacher), and its answers flip-averaged (--teacher-tta flip: one pass of twice the images)."""
    settings = dict(opt="muon", model_ema=True, amp=True, distillation_type=kind, teacher_tta=tta)
    if stem == "whiten":
        settings.update(
            teacher_stem="whiten", teacher_channel_mult=[1, 4, 4], teacher_recipe="airbench"
        )
    updated = engine_run(device, **settings, graph_update=True)
    stepped = engine_run(device, **settings, graph_step=True)
    losses = {"updated": train_steps(updated, 4), "stepped": train_steps(stepped, 4)}
    assert (stepped.step.captured is not None) is (device.type == "cuda")
    if device.type == "cpu":
        assert losses["stepped"] == losses["updated"]
    assert losses["stepped"] == pytest.approx(losses["updated"], rel=1e-4)
    plain = engine_run(device, **{**settings, "distillation_type": "none"}, graph_step=True)
    assert train_steps(plain, 4) != pytest.approx(losses["stepped"], rel=1e-3)


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_step_graph_redraws_stochastic_depth_each_replay_and_captures_again_for_a_new_rate():
    """The captured step draws stochastic depth anew at each replay (a graph replaying one
    draw would drop the same blocks every step): with the weights held still (a learning rate
    of 1e-12, below float32's resolution of the weights, and no weight decay), one batch's
    losses differ from step to step. A new patch-drop rate (what --patch-drop-anneal sets
    between epochs) captures the step again."""
    device = torch.device("cuda")
    settings = dict(opt="muon", drop_path=0.5, lr=1e-12, min_lr=1e-12, weight_decay=0.0)
    run = engine_run(device, **settings, clip_grad=None, graph_step=True)
    losses = train_steps(run, 4)
    first = run.step.captured
    assert first is not None and len(set(losses)) == 4, losses
    run.model.patch_drop.prob = 0.25
    train_steps(run, 2)
    assert run.step.captured is not first and run.step.captured.key[-1] == 0.25
    assert run.step.capturable


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_step_graph_steps_on_where_cuda_refuses_the_capture(monkeypatch, caplog):
    """A step capture CUDA refuses: one warning, the warm-up's update undone, that step taken
    uncaptured and the next ones as without the step's graph (the eager run's steps, within
    the bound of the captured ones)."""
    from vit.training import step_graph

    def refused():
        raise RuntimeError("operation not permitted when stream is capturing (a test's)")

    monkeypatch.setattr(step_graph.torch.cuda, "CUDAGraph", refused)
    device = torch.device("cuda")
    settings = dict(opt="muon", model_ema=True, model_ema_decay=0.9, clip_grad=0.05)
    eager = engine_run(device, **settings)
    refusing = engine_run(device, **settings, graph_step=True)
    with caplog.at_level("WARNING", logger="vit"):
        train_steps(eager, 3)
        train_steps(refusing, 3)
    assert refusing.step.captured is None and not refusing.step.capturable
    assert [r.message for r in caplog.records if "--graph-step: the training" in r.message]
    assert_the_same_steps(eager.state, refusing.state)


@pytest.mark.slow  # torch.compile: a minute of compilation and CUDA graph capture
def test_compiled_step_graph_trains_as_the_recipes_graphs_do(device):
    """The step's graph around the compiled model and loss (--compile, mode default: its
    kernels without CUDA graphs of their own) trains as the recipe's way does, the forward
    and backward replayed as reduce-overhead's CUDA graphs and the update captured alone (the
    same bound as reduce-overhead's against the eager steps)."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU (on a CPU reduce-overhead compiles as default)")
    settings = dict(compile=True, opt="muon", model_ema=True)
    recipe = engine_run(device, **settings, compile_mode="reduce-overhead", graph_update=True)
    stepped = engine_run(device, **settings, graph_step=True)
    assert train_steps(stepped, 5) == pytest.approx(train_steps(recipe, 5), rel=1e-4)
    assert stepped.step.captured is not None


def test_adamw_is_one_fused_kernel_on_a_gpu_only(device):
    """On a GPU torch's fused AdamW (one launch for every tensor); on the CPU the foreach
    update every CPU run so far took."""
    run = engine_run(device, opt="adamw")
    assert bool(run.state.optimizer.defaults["fused"]) == (device.type == "cuda")
    losses = train_steps(run, 3)
    assert losses[-1] < losses[0]


# -- the in-memory pipeline on the device -------------------------------------------------------
def _source_images(count: int = 64, side: int = 8) -> torch.Tensor:
    """(count, side, side, 3) uint8 images with no two equal windows (random bytes)."""
    generator = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (count, side, side, 3), dtype=torch.uint8, generator=generator)


@pytest.mark.parametrize("augment_batches", [1, 3])
def test_batches_on_the_device_are_crops_and_flips_of_their_images(device, augment_batches):
    """--batch-augment on `device`: the images, labels and draws live there; every yielded
    image is its source (its label is its index) padded, cropped at one of the (2p+1)^2
    offsets, maybe flipped, normalised; over the epoch about half are flipped and every offset
    occurs. On the CPU the draws are today's (tests/test_training_levers.py pins them); on a GPU
    they come from its generator: these properties are what both must have. Also with the
    epoch's 4 batches augmented 3 at a time (--augment-batches: a full call, then one filled
    up with images whose copies are dropped)."""
    from vit.data.batch_pipeline import InMemoryBatches

    source = _source_images()
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    batches = InMemoryBatches(
        source,
        range(len(source)),
        batch_size=16,
        mean=mean,
        std=std,
        pad=2,
        seed=5,
        device=device,
        augment_batches=augment_batches,
    )
    batches.set_epoch(1)
    padded = torch.nn.functional.pad(source.permute(0, 3, 1, 2).float(), (2, 2, 2, 2))
    norm_mean = torch.tensor(mean).view(3, 1, 1) * 255
    norm_std = torch.tensor(std).view(3, 1, 1) * 255
    offsets, flips, seen = set(), 0, []
    for images, labels in batches:
        assert images.device.type == labels.device.type == device.type
        for image, label in zip(images.cpu(), labels.cpu().tolist(), strict=True):
            pixels = image * norm_std + norm_mean  # back to 0..255
            found = [
                (dy, dx, flip)
                for dy in range(5)
                for dx in range(5)
                for flip in (False, True)
                if torch.allclose(
                    pixels,
                    (lambda w: w.flip(-1) if flip else w)(
                        padded[label, :, dy : dy + 8, dx : dx + 8]
                    ),
                    atol=1e-3,
                )
            ]
            assert found, f"image {label}: no crop or flip of its source"
            offsets.add(found[0][:2])
            flips += found[0][2]
            seen.append(label)
    assert sorted(seen) == list(range(len(source)))  # each image once per epoch
    assert 16 <= flips <= 48  # Binomial(64, 1/2): outside 16..48 has probability < 1e-4
    assert len(offsets) >= 20  # 25 offsets, 64 draws: missing 6 has probability < 1e-3


def test_repeated_copies_on_the_device_are_each_their_own(device):
    """--aug-repeats 2 over two processes on `device`: both take the epoch's same images, one
    copy each; under alternating flips the copies are mirror images of each other, and with a
    crop each process draws its own offsets."""
    from vit.data.batch_pipeline import InMemoryBatches

    def first_batch(rank: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        batches = InMemoryBatches(
            _source_images(), range(64), batch_size=16, mean=(0, 0, 0), std=(1, 1, 1),
            pad=pad, hflip_alternate=True, aug_repeats=2, seed=5, rank=rank, world_size=2,
            device=device,
        )  # fmt: skip
        batches.set_epoch(1)
        return next(iter(batches))

    (x0, y0), (x1, y1) = first_batch(0, pad=0), first_batch(1, pad=0)
    assert x0.device.type == device.type and torch.equal(y0, y1)
    assert torch.equal(x1, x0.flip(-1))
    (x0, _), (x1, _) = first_batch(0, pad=2), first_batch(1, pad=2)
    assert not torch.equal(x1, x0.flip(-1))  # other crops


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_randaugment_on_the_device_is_the_cpus(device, compiled):
    """RandAugment drawn on `device`: each image is what the CPU's ops make of it with the ops
    and magnitudes the device's generator drew (on CUDA every op runs on the whole batch;
    tests/test_batch_randaugment.py compares the CPU's with torchvision's), eager or compiled
    (what --compile runs on a GPU; on the CPU, inductor's C++ in place of Triton's kernels).
    One round, so that posterize and equalize read whole pixel values on both; 1e-2 of 255
    covers bilinear sampling's float32 rounding on either device."""
    from vit.data.batch_randaugment import OPS, apply_ops, compiled_apply_ops, rand_augment

    x = torch.randint(0, 256, (64, 3, 12, 16), generator=torch.Generator().manual_seed(1))
    x = x.float().to(device)
    apply = compiled_apply_ops() if compiled else None
    out = rand_augment(x, 1, torch.Generator(device=device).manual_seed(2), apply=apply)
    replay = torch.Generator(device=device).manual_seed(2)
    op = torch.randint(len(OPS), (64,), generator=replay, device=device)
    u = torch.rand(64, generator=replay, device=device)
    # the CPU's other way: per op on its images, or (beside the CPU's own) on the whole batch
    expected = apply_ops(x.cpu(), op.cpu(), u.cpu(), whole_batch=device.type == "cpu")
    assert out.device.type == device.type
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=1e-2)
    assert len(set(op.tolist())) >= 10  # 64 draws of 13 ops: most ops are in the batch


def test_compiled_randaugment_batches_are_the_eager_ones(device):
    """--compile's RandAugment in the pipeline (two rounds, after crop and flip): on CUDA the
    eager batches within float32 rounding (a value that rounding moves across a whole pixel
    value changes posterize's or equalize's level: allowed for one value in 1,000); on the CPU
    it stays eager, each op on its own images: the same batches exactly."""
    from vit.data.batch_pipeline import InMemoryBatches

    data = torch.randint(0, 256, (128, 3, 16, 16), generator=torch.Generator().manual_seed(3))
    data = data.to(torch.uint8)
    settings = dict(batch_size=64, mean=(0.5,) * 3, std=(0.25,) * 3, randaug_ops=2, seed=4)
    eager = InMemoryBatches(data, range(128), device=device, **settings)
    compiled = InMemoryBatches(data, range(128), device=device, compile_randaug=True, **settings)
    assert (compiled.apply_randaug is None) == (device.type == "cpu")
    for (x, y), (x_compiled, y_compiled) in zip(eager, compiled, strict=True):
        assert torch.equal(y, y_compiled)
        if device.type == "cpu":
            assert torch.equal(x, x_compiled)
        else:
            off = (x - x_compiled).abs() > 1e-2  # in normalised units: 0.64 of a pixel value
            assert off.float().mean() < 1e-3


def test_erasing_on_the_device_fills_one_box_per_chosen_image(device):
    """Random erasing drawn on `device`: each chosen image gets one box of 10-40% a side filled
    with noise of unit variance, the others are untouched, about `prob` of them chosen."""
    from vit.data.batch_pipeline import random_erase

    x = torch.full((256, 3, 20, 20), 7.0, device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    out = random_erase(x, prob=0.5, generator=generator).cpu()
    changed = (out != 7.0).any(dim=1)  # (B, H, W)
    chosen = changed.flatten(1).any(dim=1)
    assert 96 <= int(chosen.sum()) <= 160  # Binomial(256, 1/2)
    for mask in changed[chosen]:
        rows, cols = mask.any(dim=1).nonzero(), mask.any(dim=0).nonzero()
        height, width = int(rows.max() - rows.min() + 1), int(cols.max() - cols.min() + 1)
        assert 2 <= height <= 8 and 2 <= width <= 8  # 10-40% of 20
        assert int(mask.sum()) == height * width  # one rectangle
    noise = out[chosen][(out[chosen] != 7.0)]
    assert abs(float(noise.std()) - 1) < 0.1 and abs(float(noise.mean())) < 0.1


def test_test_images_on_the_device_equal_the_evaluation_transform(device):
    """The test batches evaluated from memory on `device` hold the evaluation transform's
    values (ToTensor, Normalize: the same operations), each process its every world-th image."""
    from vit.data.batch_pipeline import InMemoryEvalBatches
    from vit.data.transforms import EvalTransform

    source = _source_images(count=10, side=32).numpy()
    preprocess = vit.create_model("vit_cifar_patch4_32", **TINY).preprocess
    transform = EvalTransform(preprocess)
    for rank in range(2):
        batches = InMemoryEvalBatches(
            source,
            range(10),
            batch_size=4,
            mean=preprocess.mean,
            std=preprocess.std,
            rank=rank,
            world_size=2,
            device=device,
        )
        labels = torch.cat([y for _, y in batches]).cpu()
        images = torch.cat([x for x, _ in batches]).cpu()
        assert labels.tolist() == list(range(rank, 10, 2)) and len(batches) == 2
        expected = torch.stack([transform(source[i]) for i in labels.tolist()])
        torch.testing.assert_close(
            images, expected, rtol=0, atol=0 if device.type == "cpu" else 1e-6
        )


# -- train.py on the device: batch augmentation, resume, save here and load there, DDP ----------
def train_run(
    train_script, image_folder: Path, run: Path, device, epochs: int, *extra, status: int = 0
) -> Path:
    args = [
        "--data", str(image_folder), "--output-dir", str(run), "--epochs", str(epochs),
        *TINY_KWARGS, "--batch-size", "8", "--lr", "3e-3", "--warmup-epochs", "1",
        "--workers", "0", "--cache-dir", "none", *device_args(torch.device(device)), *extra,
    ]  # fmt: skip
    assert train_script.main(args) == status
    return run


def stopped_after_first_epoch(train_script, image_folder, run, device, monkeypatch) -> Path:
    """A 2-epoch run stopped by Ctrl-C once its epoch-1 checkpoint is saved (status 130)."""
    with monkeypatch.context() as patch:
        stop_after_first_save(patch)
        train_run(train_script, image_folder, run, device, 2, status=130)
    assert torch.load(run / "training_state.pt", weights_only=True)["epoch"] == 1
    return run


def test_batch_augment_trains_on_the_device(device, image_folder, tmp_path, train_script):
    """--batch-augment: uint8 batches augmented in memory, moved to the device, trained on."""
    run = train_run(train_script, image_folder, tmp_path / "run", device, 2, "--batch-augment")
    rows = read_rows(run / "metrics.csv")
    assert len(rows) == 2 and float(rows[1]["train_loss"]) < float(rows[0]["train_loss"])
    config = (run / "config.yaml").read_text()
    assert "batch_augment: true" in config and f"device: {device.type}" in config


@pytest.fixture(scope="module")
def straight_runs(image_folder, tmp_path_factory, train_script):
    """Two uninterrupted epochs per device, made once: what a resumed run must reproduce."""
    made = {}

    def get(device: torch.device) -> Path:
        if device.type not in made:
            run = tmp_path_factory.mktemp(f"straight-{device.type}") / "run"
            made[device.type] = train_run(train_script, image_folder, run, device, 2)
        return made[device.type]

    return get


def test_resume_on_the_device_reproduces_the_uninterrupted_run(
    device, image_folder, tmp_path, train_script, straight_runs, monkeypatch
):
    """Bit-identical on the CPU; within rounding on CUDA (its kernels may sum in another order
    from one launch to the next)."""
    run = stopped_after_first_epoch(
        train_script, image_folder, tmp_path / "run", device, monkeypatch
    )
    assert train_script.main(["--resume", str(run)]) == 0
    straight = straight_runs(device)
    if device.type == "cpu":
        assert_close_weights(run / "model.safetensors", straight / "model.safetensors", atol=0)
        assert (
            read_rows(run / "metrics.csv")[1]["train_loss"]
            == (read_rows(straight / "metrics.csv")[1]["train_loss"])
        )
    else:
        assert_weights_within_rounding(
            run / "model.safetensors", straight / "model.safetensors", atol=1e-4
        )


# (the ids say "host" for the CPU: `-k cuda` selects every CUDA case, `-k cpu` every CPU one)
@pytest.mark.parametrize("direction", ["device-to-host", "host-to-device"])
def test_state_saved_on_one_device_resumes_on_the_other(
    device, direction, image_folder, tmp_path, train_script, straight_runs, monkeypatch
):
    """A run folder written on the device continues on the CPU, and the reverse (--device may
    change on --resume): the checkpoint maps to where it is loaded, optimizer state included,
    and the result is the uninterrupted run's (exactly when both are the CPU)."""
    first, second = (device, "cpu") if direction == "device-to-host" else ("cpu", device)
    run = stopped_after_first_epoch(
        train_script, image_folder, tmp_path / "run", first, monkeypatch
    )
    saved = torch.load(run / "training_state.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in saved["model"].values())  # read back on the CPU
    resume = ["--resume", str(run), "--device", str(second)]
    assert train_script.main(resume) == 0
    reference = straight_runs(torch.device("cpu"))
    if device.type == "cpu":
        assert_close_weights(run / "model.safetensors", reference / "model.safetensors", atol=0)
    else:
        assert_weights_within_rounding(
            run / "model.safetensors", reference / "model.safetensors", atol=1e-3
        )
    model = vit.load_model(run / "model.safetensors").to(device)  # and loads on the device
    assert next(model.parameters()).device.type == device.type


def test_ddp_under_torchrun_with_one_process_equals_one_process(
    device, image_folder, tmp_path, straight_runs
):
    """torchrun, one process: DDP over NCCL on a GPU (gloo on the CPU, the same code path).
    All-reducing one process's gradients changes nothing: the plain run's weights."""
    run = tmp_path / "ddp"
    args = [
        "--data", str(image_folder), "--output-dir", str(run), "--epochs", "2", *TINY_KWARGS,
        "--batch-size", "8", "--lr", "3e-3", "--warmup-epochs", "1", "--workers", "0",
        "--cache-dir", "none", *device_args(device),
    ]  # fmt: skip
    command = [sys.executable, "-m", "vit.distributed", "--standalone", "--nproc_per_node", "1"]
    # this checkout first, and whatever the environment adds (the GPU machine's carried wheels)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, str(ROOT / "train.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected_device = "cuda:0" if device.type == "cuda" else "cpu"  # NCCL's branch: a GPU index
    assert f"1 process(es), device {expected_device}" in done.stderr
    straight = straight_runs(device)
    if device.type == "cpu":
        assert_close_weights(run / "model.safetensors", straight / "model.safetensors", atol=0)
    else:
        assert_weights_within_rounding(
            run / "model.safetensors", straight / "model.safetensors", atol=1e-4
        )


# -- the commands with --device: predict (and its --explain), evaluate; export ------------------
@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    """The TINY model (random weights, a head with signal) saved with the test classes."""
    ours, _ = tiny_pair()
    return vit.save_weights(
        ours, tmp_path_factory.mktemp("weights") / "tiny.safetensors", class_names=list(CLASSES)
    )


def predictions(tmp_path: Path, weights: Path, images: Path, device: str, name: str) -> dict:
    from vit import predict

    output = tmp_path / f"{name}.json"
    argv = [str(images), "--checkpoint", str(weights), "--device", device, "--workers", "0"]
    assert predict.main([*argv, "--output", str(output), "--top-k", "3"]) == 0
    return {Path(r["path"]).name: r for r in json.loads(output.read_text())}


def test_predict_on_the_device_matches_the_cpu(device, weights_file, image_folder, tmp_path):
    images = image_folder / "test" / "red"
    here = predictions(tmp_path, weights_file, images, str(device), "device")
    cpu = predictions(tmp_path, weights_file, images, "cpu", "cpu")
    assert here.keys() == cpu.keys() and len(here) == 6
    for name, record in here.items():
        assert record["label"] == cpu[name]["label"], name
        assert record["probability"] == pytest.approx(cpu[name]["probability"], abs=1e-4)


def test_evaluate_on_the_device_matches_the_cpu(
    device, weights_file, image_folder, tmp_path, evaluate_script
):
    reports = {}
    for run, where in enumerate((str(device), "cpu")):  # the device may be the CPU too
        report = tmp_path / f"{run}-{where}.json"
        argv = ["--checkpoint", str(weights_file), "--data", str(image_folder), "--workers", "0"]
        argv += ["--device", where, "--json", str(report), "--output-dir", str(tmp_path / where)]
        assert evaluate_script.main(argv) == 0
        reports[where] = json.loads(report.read_text())
    here, cpu = reports[str(device)], reports["cpu"]
    assert here["top1"] == cpu["top1"] and here["num_images"] == cpu["num_images"] == 18
    assert here["loss"] == pytest.approx(cpu["loss"], rel=1e-4)


def test_bfloat16_weights_on_the_device_stay_near_float32(
    device, weights_file, image_folder, tmp_path
):
    """--model-dtype bfloat16 on the device: the same classes as float32 on the CPU (at most one
    image of six changes), probabilities within bfloat16's rounding, no warning where bf16 is
    native (a GPU, or a CPU with AVX512-BF16 / AMX)."""
    from vit import predict
    from vit.inference.precision import fast_bfloat16

    images = image_folder / "test" / "red"
    output = tmp_path / "bf16.json"
    argv = [str(images), "--checkpoint", str(weights_file), "--device", str(device)]
    argv += ["--workers", "0", "--model-dtype", "bfloat16", "--output", str(output)]
    assert predict.main(argv) == 0
    fast = {Path(r["path"]).name: r for r in json.loads(output.read_text())}
    exact = predictions(tmp_path, weights_file, images, "cpu", "cpu")
    assert fast.keys() == exact.keys() and len(fast) == 6
    changed = sum(fast[name]["label"] != exact[name]["label"] for name in fast)
    assert changed <= 1
    for name in fast:
        assert fast[name]["probability"] == pytest.approx(exact[name]["probability"], abs=0.05)
    if device.type == "cuda":
        assert fast_bfloat16(device)


def test_explain_on_the_device_matches_the_cpu_and_takes_the_explicit_path(
    device, weights_file, image_folder, tmp_path
):
    from vit import explain, predict

    model = vit.load_model(weights_file)
    x = torch.randn(2, 3, 32, 32)
    cpu_map = explain.attention_rollout(model, x)
    model.to(device)
    with torch.profiler.profile() as profiler:
        device_map = explain.attention_rollout(model, x.to(device))
    ops = {event.key for event in profiler.key_averages()}
    assert "aten::softmax" in ops or "aten::_softmax" in ops  # the explicit path's softmax
    assert not [op for op in ops if "scaled_dot_product" in op]  # and no fused attention
    assert all(attention.fused_attn for attention in _attentions(model))  # switched back
    assert device_map.device.type == device.type
    assert relative_error(device_map.cpu(), cpu_map) <= 1e-4
    folder = tmp_path / "maps"
    argv = [str(image_folder / "test" / "red"), "--checkpoint", str(weights_file)]
    assert predict.main([*argv, "--device", str(device), "--explain", str(folder)]) == 0
    assert len(list(folder.glob("*.png"))) == 6


def test_weights_saved_on_the_device_export_verified(device, tmp_path):
    """`python -m vit.export` (no --device: it loads and verifies on the CPU) takes weights
    saved from a model on the device; the exported torchvision model gives the device model's
    logits (export checks to 1e-5; here against the device's own output too)."""
    from vit import export

    ours, _ = tiny_pair()
    ours.to(device)
    weights = vit.save_weights(ours, tmp_path / "device.safetensors", class_names=list(CLASSES))
    target = tmp_path / "tv.pt"
    assert export.main([str(weights), "--torchvision", str(target), "--tolerance", "1e-5"]) == 0
    assert target.is_file()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = ours(x.to(device)).cpu()
        loaded = vit.load_model(weights)(x)
    assert relative_error(loaded, expected) <= 1e-4


# -- fused attention: which kernel runs, checked ------------------------------------------------
def _attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "fused_attn")]


def sdpa_ops(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> set[str]:
    """The scaled-dot-product-attention ops the profiler saw in one forward pass."""
    autocast = torch.autocast(x.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    with torch.no_grad(), autocast, torch.profiler.profile() as profiler:
        model(x)
    return {e.key for e in profiler.key_averages() if "scaled_dot_product" in e.key}


# The fused kernels each device has: flash on the CPU; on CUDA flash, memory-efficient or cuDNN.
FUSED_OPS = {
    "cpu": {"aten::_scaled_dot_product_flash_attention_for_cpu"},
    "cuda": {
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    },
}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float32", "bf16"])
def test_fused_attention_takes_a_fused_kernel(device, dtype):
    ours, _ = tiny_pair()
    ours.to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    seen = sdpa_ops(ours, x, dtype)
    assert seen & FUSED_OPS[device.type], seen  # not the math fallback (explicit ops)
    ours.set_fused_attn(False)
    assert sdpa_ops(ours, x, dtype) == set()  # the explicit path calls no fused op


@pytest.mark.parametrize(
    ("backend", "dtype"),
    [("FLASH_ATTENTION", torch.bfloat16), ("FLASH_ATTENTION", None), ("EFFICIENT_ATTENTION", None)],
    ids=["flash-bf16", "flash-float32", "efficient-float32"],
)
def test_flash_and_efficient_kernels_accept_our_attention(device, backend, dtype):
    """Restricted to one backend, SDPA raises if it cannot use it: ours runs there, and gives
    timm's logits under the same restriction. CUDA's flash kernel takes half precision only,
    the CPU has no memory-efficient kernel: those cases are not kernels of the device."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    available = {"cpu": {"FLASH_ATTENTION"}, "cuda": {"FLASH_ATTENTION", "EFFICIENT_ATTENTION"}}
    if backend not in available[device.type] or (device.type, backend, dtype) == (
        "cuda",
        "FLASH_ATTENTION",
        None,
    ):
        pytest.skip(f"{device.type} has no {backend} kernel for {dtype or torch.float32}")
    ours, theirs = (m.to(device) for m in tiny_pair())
    x = torch.randn(4, 3, 32, 32, device=device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    with torch.no_grad(), sdpa_kernel(getattr(SDPBackend, backend)), autocast:
        out, reference = ours(x), theirs(x)
    assert relative_error(out.float().cpu(), reference.float().cpu()) <= 1e-5


# -- scripts/gpu_check.sh ------------------------------------------------------------------------
GPU_CHECK = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", str(GPU_CHECK), *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )


def pack_images(image_folder: Path, build: Path) -> None:
    """What `gpu_check.sh --pack` carries: the images in one file, under a build folder."""
    packer = [sys.executable, str(ROOT / "scripts" / "pack_cifar10.py")]
    packing = [*packer, "--source", str(image_folder), "--output", str(build / "cifar10-jpg.npz")]
    subprocess.run(packing, check=True, capture_output=True)


@pytest.mark.skipif(CUDA, reason="there is a GPU here: gpu_check.sh runs instead of refusing")
def test_gpu_check_refuses_without_a_gpu_in_one_line_writing_nothing(tmp_path):
    done = gpu_check(str(tmp_path / "out"))
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "gpu_check.sh: no CUDA GPU here (torch.cuda.is_available() is False, or no torch for "
        f"{sys.executable}); nothing was run"
    ]
    assert not (tmp_path / "out").exists()


TIME_BOX_S = 18  # the first train call's box: python's start, the data, then some epochs
# the train stage's tiny run: float32 (the recipe's bfloat16 is emulated, 4x slower, on a CPU
# without AVX512-BF16), one thread
TIME_BOXED_ARGS = [*TINY_KWARGS, "--batch-size", "8", "--warmup-epochs", "1", "--cache-dir"]
TIME_BOXED_ARGS += ["none", "--threads", "1", "--no-amp"]


def epochs_outlasting(seconds: float, image_folder: Path, tmp_path: Path) -> int:
    """Epochs of the train stage's tiny run that take three times `seconds` at this host's pace
    (200 at least: about a minute on a Zen 3), so that a box of `seconds` always cuts the run,
    however fast the host (a Zen 5 once ran 200 of them inside the 18 s box), and resuming it
    takes about the same time anywhere. The pace: seconds between the ends of epochs 2 and 10."""
    run = tmp_path / "pace"
    flags = ["--config", "configs/cifar10.yaml", "--data", str(image_folder), "--epochs", "10"]
    flags += ["--output-dir", str(run), "--workers", "0", "--device", "cpu"]
    subprocess.run([sys.executable, "train.py", *flags, *TIME_BOXED_ARGS], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    with open(run / "metrics.csv", newline="") as handle:
        ends = [float(row["finished_at"]) for row in csv.DictReader(handle)]
    pace = (ends[-1] - ends[1]) / (len(ends) - 2)
    return max(200, int(3 * seconds / pace) + 1)


@pytest.mark.slow  # five starts of python, a tiny run of 200 epochs or more: 1-2 minutes on a CPU
def test_gpu_check_stages_time_box_and_resume_on_a_fresh_machine(image_folder, tmp_path):
    """The script's mechanics on the CPU (VIT_GPU_CHECK_CPU=1): a time-boxed train stage stops
    the run after a checkpoint (status 130, not a failure), hands its state to $OUT, and a
    fresh OUTDIR given it back by --restore resumes the run to its end (without the packed
    images, on those the first call unpacked: the two-call resume), the records of both chunks
    in one JSON; a finished run is not trained again; bench writes its rows."""
    build, out = tmp_path / "build", tmp_path / "out"
    pack_images(image_folder, build)
    out.mkdir()
    epochs = epochs_outlasting(TIME_BOX_S, image_folder, tmp_path)
    settings = dict(
        VIT_GPU_CHECK_CPU="1",
        VIT_GPU_BUILD=str(build),
        VIT_GPU_DATA=str(tmp_path / "data"),
        VIT_GPU_EPOCHS=str(epochs),
        VIT_GPU_TRAIN_ARGS=" ".join(TIME_BOXED_ARGS),
        VIT_GPU_BENCH_ARGS="--models vit_cifar_patch4_32 --batch-size 2 --rounds 1 --iters 1",
    )
    first = gpu_check(str(tmp_path / "machine1"), "train", OUT=str(out),
                      VIT_GPU_TRAIN_SECONDS=str(TIME_BOX_S), **settings)  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:]
    assert "no failed stage(s)" in first.stdout
    assert sorted(p.name for p in out.iterdir())[:2] == ["gpu_check.json", "gpu_check.log"]
    records = json.loads((out / "gpu_check.json").read_text())
    assert records["train_chunks"][0]["status"] == 130  # the time box stopped it
    done_first = len(records["epochs"])
    assert 0 < done_first < epochs

    restored = gpu_check("--restore", str(out), **settings)
    assert restored.returncode == 0, restored.stderr
    # The state and the packed images together can pass the device tool's 64 MiB: the second
    # call then carries the state alone, and trains on the images the first call unpacked.
    (build / "cifar10-jpg.npz").unlink()
    second = gpu_check(str(tmp_path / "machine2"), "train", "bench",
                       VIT_GPU_TRAIN_SECONDS="300", **settings)  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:]
    assert "restoring the run from" in second.stdout
    assert f"resumed {tmp_path / 'machine2' / 'run'} after epoch {done_first}" in second.stdout
    records = json.loads((tmp_path / "machine2" / "gpu_check.json").read_text())
    assert [chunk["status"] for chunk in records["train_chunks"]] == [130, 0]
    assert [row["epoch"] for row in records["epochs"]] == list(range(1, epochs + 1))
    assert records["throughput"]["rows"][0]["model"] == "vit_cifar_patch4_32"
    assert records["environment"]["torch"] == torch.__version__

    again = gpu_check(str(tmp_path / "machine2"), "train", **settings)
    assert again.returncode == 0 and "nothing to train" in again.stdout


def speedrun_stage(image_folder: Path, tmp_path: Path, stage: str = "speedrun", **env: str):
    """gpu_check.sh's speedrun (or pipeline) stage on the CPU, the images packed as --pack
    packs them: the finished process and the records that came back in $OUT."""
    build, out = tmp_path / "build", tmp_path / "out"
    pack_images(image_folder, build)
    out.mkdir()
    done = gpu_check(
        str(tmp_path / "machine"),
        stage,
        OUT=str(out),
        VIT_GPU_CHECK_CPU="1",
        VIT_GPU_BUILD=str(build),
        VIT_GPU_DATA=str(tmp_path / "data"),
        **env,
    )
    return done, json.loads((out / "gpu_check.json").read_text())


def test_a_pipeline_row_takes_settings_of_its_own_after_a_colon(monkeypatch, tmp_path):
    """benchmarks/training_pipeline.py: 'YAML:KEY=VALUE,KEY=VALUE' is the YAML's recipe with
    those settings, under --set's; a key train.py does not know is refused by name."""
    import argparse

    pipeline = repository_module(monkeypatch, "benchmarks", "training_pipeline")
    args = argparse.Namespace(data=str(tmp_path), images=64, epochs=1, workers=0, cache_dir="none")
    args.set = [("batch_size", 32)]
    row = "configs/cifar10_gpu_speedrun.yaml:graph_update=false,batch_size=1024,lr=0.004"
    cfg = pipeline.row_config(row, "config", args, torch.device("cpu"))
    assert (cfg.graph_update, cfg.batch_size, cfg.lr) == (False, 32, 0.004)
    assert cfg.opt == "muon" and cfg.compile  # the rest: the YAML's
    plain = pipeline.row_config(row.split(":")[0], "config", args, torch.device("cpu"))
    assert plain.graph_update and plain.lr == 2e-3
    with pytest.raises(argparse.ArgumentTypeError, match="'learning_rate' is no train.py"):
        pipeline.row_config(f"{row},learning_rate=1", "config", args, torch.device("cpu"))


def test_a_benchmark_shape_label_gives_width_depth_heads_ratio_and_patch_size(monkeypatch):
    """benchmarks/training_throughput.py's shape labels, which training_pipeline.py's --shapes
    takes: "-p2" after a shape makes its patches 2 pixels (256 tokens of a 32x32 image); a label
    of neither form is refused with the form it should take."""
    import argparse

    throughput = repository_module(monkeypatch, "benchmarks", "training_throughput")
    shape = dict(embed_dim=256, depth=8, num_heads=4, mlp_ratio=2.0)
    assert throughput.parse_shape("256d-8L-4h-r2") == ("256d-8L-4h-r2", shape)
    _, patch2 = throughput.parse_shape("256d-8L-4h-r2-p2")
    assert patch2 == shape | dict(patch_size=2)
    model = vit.create_model("vit_cifar_patch4_32", **patch2)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert model.patch_embed.num_patches == 256
    with pytest.raises(argparse.ArgumentTypeError, match="'192d-4L-6h-r2-p2'"):
        throughput.parse_shape("256d-8L-4h-p2")


def repository_module(monkeypatch, folder: str, name: str):
    """ROOT/folder/name.py as a module: benchmarks/ and scripts/ are folders of scripts, not
    packages."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / folder))
    return importlib.import_module(name)


def speedrun_proxy(monkeypatch):
    """benchmarks/speedrun_proxy.py as a module."""
    return repository_module(monkeypatch, "benchmarks", "speedrun_proxy")


def speedrun_proxy_rows(monkeypatch, tmp_path, train_script) -> dict[str, TrainConfig]:
    """row name -> the settings train.py parses from the proxy's command for it (seed 1)."""
    proxy = speedrun_proxy(monkeypatch)
    monkeypatch.chdir(ROOT)  # the rows' --config is the repository's
    return {
        # past python and train.py
        name: train_script.parse_config(proxy.command(name, "data", tmp_path, seed=1)[2:])
        for name in proxy.ROWS
    }


def assert_differs_only_in(row: TrainConfig, base: TrainConfig, *fields: str) -> None:
    """`row` is `base` but for `fields` (and the output folder every row has its own); where it is
    not, pytest's message shows the settings that differ."""
    same = {field: getattr(base, field) for field in fields}
    assert dataclasses.replace(row, **same, output_dir=base.output_dir) == base


def test_the_speedrun_proxy_rows_are_train_commands_of_the_recipe_each_with_its_change(
    monkeypatch, tmp_path, train_script
):
    """benchmarks/speedrun_proxy.py: every row is a train.py command of the speedrun's recipe at
    the proxy's scale, with its own flags (those without a teacher)."""
    settings = speedrun_proxy_rows(monkeypatch, tmp_path, train_script)
    recipe = settings["recipe"]
    expected = dict(opt="muon", aa="randaug", epochs=100, batch_size=128, train_subset=10000)
    expected.update(seed=1, device="cpu", compile=False)
    assert {key: getattr(recipe, key) for key in expected} == expected
    assert recipe.model_kwargs["embed_dim"] == 128 and recipe.model_kwargs["depth"] == 6
    both = settings["randaug3-reprob"]
    assert (both.aa_n, both.reprob) == (3, 0.25) and both.model_kwargs == recipe.model_kwargs
    assert settings["no-randaug"].aa in (None, "none")
    longer = settings["epochs200"]  # as --time-budget would plan 200 epochs from the recipe's 100
    assert (longer.epochs, longer.warmup_epochs, longer.mixup_off_epoch) == (200, 5, 190)
    wider = settings["width192"].model_kwargs
    assert wider == recipe.model_kwargs | dict(embed_dim=192, num_heads=6)
    assert (settings["lr1e-3"].lr, settings["lr4e-3"].lr, recipe.lr) == (1e-3, 4e-3, 2e-3)
    assert (settings["wd0.05"].weight_decay, recipe.weight_decay) == (0.05, 0.1)
    assert (settings["drop-path0"].drop_path, recipe.drop_path) == (0.0, 0.1)
    shorter, patch2 = settings["epochs50"], settings["patch2-epochs50"]
    assert (shorter.epochs, shorter.warmup_epochs, shorter.mixup_off_epoch) == (50, 5, 40)
    assert (patch2.epochs, patch2.warmup_epochs, patch2.mixup_off_epoch) == (50, 5, 40)
    assert patch2.model_kwargs == recipe.model_kwargs | dict(patch_size=2)
    assert shorter.model_kwargs == recipe.model_kwargs and recipe.threads == 1
    mimetic, mimetic200 = settings["mimetic"], settings["mimetic-epochs200"]
    assert mimetic.mimetic_init and not recipe.mimetic_init and mimetic.opt == recipe.opt == "muon"
    assert mimetic200.mimetic_init and mimetic200.epochs == settings["epochs200"].epochs == 200
    mimetic300 = settings["mimetic-epochs300"]
    planned = (mimetic300.epochs, mimetic300.warmup_epochs, mimetic300.mixup_off_epoch)
    assert planned == (300, 5, 290) and mimetic300.mimetic_init
    assert (mimetic300.drop_path, mimetic300.aa_n, mimetic300.reprob) == (0.1, 2, 0.0)
    for name, drop_path, aa_n, reprob in (
        ("mimetic-epochs300-drop-path0.2", 0.2, recipe.aa_n, recipe.reprob),
        ("mimetic-epochs300-randaug3-reprob", recipe.drop_path, 3, 0.25),
    ):
        row = settings[name]  # mimetic-epochs300 with one kind of regularisation more
        assert (row.drop_path, row.aa_n, row.reprob) == (drop_path, aa_n, reprob)
        assert_differs_only_in(row, mimetic300, "drop_path", "aa_n", "reprob")
    row = settings["mimetic-epochs200-randaug3-reprob"]  # the same at 200 epochs
    assert (row.aa_n, row.reprob, row.drop_path) == (3, 0.25, recipe.drop_path)
    assert (mimetic200.aa_n, mimetic200.reprob) == (2, 0.0)
    assert_differs_only_in(row, mimetic200, "aa_n", "reprob")
    wide150 = settings["width192-mimetic-epochs150"]
    planned = (wide150.epochs, wide150.warmup_epochs, wide150.mixup_off_epoch)
    assert planned == (150, 5, 140) and wide150.mimetic_init
    assert wide150.model_kwargs == settings["width192"].model_kwargs
    narrow150 = settings["mimetic-epochs150"]  # the same passes on the proxy's model
    assert (narrow150.epochs, narrow150.mixup_off_epoch, narrow150.mimetic_init) == (150, 140, True)
    assert narrow150.model_kwargs == recipe.model_kwargs
    for name, init in (("epochs134", False), ("mimetic-epochs134", True)):
        row = settings[name]
        planned = (row.epochs, row.warmup_epochs, row.mixup_off_epoch)
        assert planned == (134, 5, 124) and row.mimetic_init == init
    for name, num_heads, init in (
        ("heads8-epochs134", 8, False),
        ("heads8-mimetic-epochs134", 8, True),
        ("heads16-epochs134", 16, False),
    ):
        heads = settings[name]
        assert heads.model_kwargs == recipe.model_kwargs | dict(num_heads=num_heads)
        assert (heads.epochs, heads.mimetic_init) == (134, init)
    for name, epochs, num_heads, init in (
        ("batch256-lr", 100, 4, False),
        ("batch256-lr-epochs200", 200, 4, False),
        ("mimetic-batch256-lr-epochs200", 200, 4, True),
        ("heads8-batch256-lr-epochs200", 200, 8, False),
    ):
        row = settings[name]
        assert (row.batch_size, row.lr, row.epochs, row.mimetic_init) == (256, 2.8e-3, epochs, init)
        assert row.model_kwargs == recipe.model_kwargs | dict(num_heads=num_heads)
    largest = settings["batch512-lr"]
    assert (largest.batch_size, largest.lr, largest.epochs) == (512, 4e-3, 100)
    assert (largest.mixup_off_epoch, largest.warmup_epochs) == (
        recipe.mixup_off_epoch,
        recipe.warmup_epochs,
    )
    assert largest.model_kwargs == recipe.model_kwargs and not largest.mimetic_init
    chunked = settings["augment16"]
    assert (chunked.augment_batches, recipe.augment_batches, chunked.batch_augment) == (16, 1, True)
    assert_differs_only_in(chunked, recipe, "augment_batches")
    # the whitened patch embedding, that flag only, at each length (the rows' own: timm's)
    unwhitened = (shorter, longer, settings["epochs134"], mimetic200)
    assert {row.patch_embed_init for row in unwhitened} == {"default"}
    whitened = settings["whiten"]
    assert (whitened.patch_embed_init, recipe.patch_embed_init) == ("whiten", "default")
    assert_differs_only_in(whitened, recipe, "patch_embed_init")
    assert_differs_only_in(settings["whiten-epochs50"], shorter, "patch_embed_init")
    whitened200 = settings["whiten-epochs200"]
    assert whitened200.patch_embed_init == "whiten"
    assert_differs_only_in(whitened200, longer, "patch_embed_init")
    whitened134 = settings["whiten-epochs134"]
    assert_differs_only_in(whitened134, settings["epochs134"], "patch_embed_init")
    row = settings["whiten-epochs134-randaug3-reprob"]  # and the long run's augmentation
    assert (row.aa_n, row.reprob, whitened134.aa_n, whitened134.reprob) == (3, 0.25, 2, 0.0)
    assert_differs_only_in(row, whitened134, "aa_n", "reprob")
    both = settings["whiten-mimetic-epochs200"]
    assert_differs_only_in(both, mimetic200, "patch_embed_init")
    for name, init in (("adamw", False), ("adamw-mimetic", True)):
        row = settings[name]
        assert (row.opt, row.lr, row.weight_decay, row.mimetic_init) == ("adamw", 1e-3, 0.05, init)
    for name, epochs in (("patch-drop-epochs134", 134), ("patch-drop-epochs200", 200)):
        row = settings[name]
        assert (row.epochs, row.warmup_epochs, row.mixup_off_epoch) == (epochs, 5, epochs - 10)
        assert (row.patch_drop, row.patch_drop_anneal, recipe.patch_drop) == (0.5, 2, 0)
    proxy = speedrun_proxy(monkeypatch)
    threads = train_script.parse_config(proxy.command("recipe", "data", tmp_path, 0, threads=2)[2:])
    assert threads.threads == 2
    # --train-args: flags every row takes (float32 where bfloat16 is emulated), the row's own kept
    extra = ["--no-amp", "--muon-ns-dtype", "float32"]
    argv = proxy.command("whiten", "data", tmp_path, seed=1, extra=extra)[2:]
    fp32 = train_script.parse_config(argv)
    assert (fp32.amp, fp32.muon_ns_dtype, whitened.amp, whitened.muon_ns_dtype) == (
        False,
        "float32",
        True,
        "bfloat16",
    )
    assert_differs_only_in(fp32, whitened, "amp", "muon_ns_dtype")


def test_the_speedrun_proxy_rows_with_a_teacher_each_change_one_thing(
    monkeypatch, tmp_path, train_script
):
    """benchmarks/speedrun_proxy.py: the distillation rows are the whitened rows with a teacher,
    and each row after the first changes one thing of the row it is measured against."""
    settings = speedrun_proxy_rows(monkeypatch, tmp_path, train_script)
    recipe, whitened = settings["recipe"], settings["whiten"]
    speedrun = train_script.parse_config(["--config", "configs/cifar10_gpu_speedrun.yaml"])
    assert speedrun.patch_embed_init == "whiten"  # the rows pin timm's: measured before it
    # ... and no teacher, which the recipe took after them; the distillation rows are `whiten`
    # with a teacher of their own, soft or hard, and at 50 epochs whiten-epochs50 with it
    assert speedrun.distillation_type == "soft" and recipe.distillation_type == "none"
    # the first rows' teacher is the first one, a conv stem and stages (w, 2w, 4w) by the first
    # recipe, whatever the recipe's teacher is now
    first_teacher = dict(
        teacher_stem="conv", teacher_channel_mult=[1, 2, 4], teacher_recipe="dawnbench"
    )
    teacher = ("distillation_type", "teacher_width", *first_teacher)
    untaught = settings["whiten-epochs50"]
    assert (whitened.distillation_type, untaught.distillation_type) == ("none", "none")
    # ... rows without one keep the recipe's teacher settings, unused
    assert {key: getattr(untaught, key) for key in teacher[1:]} == {
        key: getattr(speedrun, key) for key in teacher[1:]
    }
    for name, kind in (("whiten-distill-soft", "soft"), ("whiten-distill-hard", "hard")):
        row = settings[name]
        assert (row.distillation_type, row.teacher_width, row.teacher_epochs) == (kind, 32, 20)
        assert {key: getattr(row, key) for key in first_teacher} == first_teacher
        assert_differs_only_in(row, whitened, *teacher)
    short = settings["whiten-distill-soft-epochs50"]  # the first teacher too
    assert {key: getattr(short, key) for key in first_teacher} == first_teacher
    assert_differs_only_in(short, untaught, *teacher)
    longer_taught = settings["whiten-distill-soft-epochs50-teacher40"]
    assert (longer_taught.teacher_epochs, short.teacher_epochs) == (40, 20)
    assert_differs_only_in(longer_taught, short, "teacher_epochs")
    # ... and the teachers trained under RandAugment, which only the rows named so have, as the
    # recipe's is
    assert speedrun.teacher_aa == "randaug"
    taught = {name for name, row in settings.items() if row.teacher_aa != "none"}
    assert taught == {
        "whiten-distill-soft-airbench-recipe-teacher-aa",
        "whiten-distill-soft-airbench-recipe-teacher-aa-tta",
        "whiten-distill-soft-airbench-recipe-teacher-aa-width64",
        "whiten-distill-soft-airbench-recipe-teacher-aa-alpha1",
        "whiten-distill-soft-airbench-recipe-teacher-aa-width64-alpha1",
        "whiten-distill-soft-airbench-recipe-teacher-aa-epochs200",
        "mimetic-distill-soft-airbench-recipe-teacher-aa-epochs200-randaug3-reprob",
        "whiten-distill-soft-airbench-recipe-teacher-aa-epochs134",
        "mimetic-distill-soft-airbench-recipe-teacher-aa-epochs134-randaug3-reprob",
        "mimetic-distill-soft-airbench-recipe-teacher-aa-randaug3-reprob",
        "width192-distill-soft-airbench-recipe-teacher-aa",
        "whiten-distill-soft-airbench-recipe-teacher-aa-tau3",
        "whiten-distill-soft-airbench-recipe-teacher-aa-epochs50",
        "width192-distill-soft-airbench-recipe-teacher-aa-epochs50",
        "whiten-distill-soft-airbench-recipe-teacher-aa-cutmix1",
        "whiten-distill-soft-airbench-recipe-teacher-aa-alpha1-cutmix1",
    }
    under_randaug = settings["whiten-distill-soft-airbench-recipe-teacher-aa"]
    flipped = settings["whiten-distill-soft-airbench-recipe-teacher-aa-tta"]  # that flag only
    assert (flipped.teacher_tta, under_randaug.teacher_tta) == ("flip", "none")
    assert_differs_only_in(flipped, under_randaug, "teacher_tta")
    assert {row.teacher_tta for row in settings.values() if row is not flipped} == {"none"}
    wider = settings["whiten-distill-soft-airbench-recipe-teacher-aa-width64"]  # and that one
    assert (wider.teacher_width, under_randaug.teacher_width) == (64, 32)
    assert_differs_only_in(wider, under_randaug, "teacher_width")
    # ... and each taught by its teacher alone: the teacher's share of the loss only
    for name, labelled in (("", under_randaug), ("-width64", wider)):
        alone = settings[f"whiten-distill-soft-airbench-recipe-teacher-aa{name}-alpha1"]
        assert (alone.distillation_alpha, labelled.distillation_alpha) == (1.0, 0.5)
        assert_differs_only_in(alone, labelled, "distillation_alpha")
    # ... and a student as wide as `width192`, with the same teacher: the model its only change
    wide_student = settings["width192-distill-soft-airbench-recipe-teacher-aa"]
    assert wide_student.model_kwargs == settings["width192"].model_kwargs
    assert_differs_only_in(wide_student, under_randaug, "model_kwargs")
    # ... and CutMix on every batch, with the labels' half of the loss and without: that flag
    # only, against the row of the same alpha
    row = "whiten-distill-soft-airbench-recipe-teacher-aa"
    for name, half in (("", under_randaug), ("-alpha1", settings[f"{row}-alpha1"])):
        every = settings[f"{row}{name}-cutmix1"]
        assert (every.mixup_prob, half.mixup_prob) == (1.0, 0.5)
        assert_differs_only_in(every, half, "mixup_prob")
    # ... and its answers softened at DeiT's temperature: that flag only
    softer = settings["whiten-distill-soft-airbench-recipe-teacher-aa-tau3"]
    assert (softer.distillation_tau, under_randaug.distillation_tau) == (3.0, 1.0)
    assert_differs_only_in(softer, under_randaug, "distillation_tau")
    # ... and over 200, 134 and 50 epochs, as planned from the recipe's 100 (warmup: by default
    # 5% of the epochs)
    planned = (under_randaug.epochs, under_randaug.warmup_epochs, under_randaug.mixup_off_epoch)
    assert planned == (100, None, 90)
    for epochs in (200, 134, 50):
        other = settings[f"whiten-distill-soft-airbench-recipe-teacher-aa-epochs{epochs}"]
        planned = (other.epochs, other.warmup_epochs, other.mixup_off_epoch)
        assert planned == (epochs, 5, epochs - 10)
        assert_differs_only_in(other, under_randaug, "epochs", "warmup_epochs", "mixup_off_epoch")
    # ... and the two students over a planned 50 epochs: again the model their only difference
    shorter = settings["whiten-distill-soft-airbench-recipe-teacher-aa-epochs50"]
    wide_shorter = settings["width192-distill-soft-airbench-recipe-teacher-aa-epochs50"]
    assert wide_shorter.model_kwargs == wide_student.model_kwargs
    assert_differs_only_in(wide_shorter, shorter, "model_kwargs")
    # ... each of them and the recipe's 100 epochs with the chooser's switch (its own flags after
    # the row's, as it puts them after the recipe's)
    chooser = speedrun_chooser(monkeypatch)
    switch = chooser.MIMETIC + chooser.LONG_RUN_AUGMENTATION
    proxy = speedrun_proxy(monkeypatch)
    for planned_length in ("-epochs200", "-epochs134", ""):
        name = f"whiten-distill-soft-airbench-recipe-teacher-aa{planned_length}"
        argv = proxy.command(name, "data", tmp_path, seed=1)[2:] + switch
        switched = settings[
            f"mimetic-distill-soft-airbench-recipe-teacher-aa{planned_length}-randaug3-reprob"
        ]
        switched_start = (switched.mimetic_init, switched.patch_embed_init, switched.aa_n)
        assert switched_start == (True, "default", 3)
        assert_differs_only_in(train_script.parse_config(argv), switched)


def test_the_speedrun_proxy_table_averages_seeds_over_the_epochs_all_reached(
    monkeypatch, tmp_path, capsys
):
    """benchmarks/speedrun_proxy.py: the table gives each seed and, over several seeds, a mean of
    only the epochs every seed reached (a run still going is not averaged in)."""
    import argparse

    from vit.training.checkpoint import write_metrics_csv

    proxy = speedrun_proxy(monkeypatch)

    def finished(name, seed, epochs):  # epochs: (epoch, top-1 %, training loss)
        history = [dict(epoch=e, ema_top1=t / 100, train_loss=loss) for e, t, loss in epochs]
        (tmp_path / f"{name}-seed{seed}").mkdir()
        write_metrics_csv(history, tmp_path / f"{name}-seed{seed}" / "metrics.csv")

    finished("recipe", 0, [(10, 50.0, 1.3), (20, 60.0, 0.9)])
    finished("recipe", 1, [(10, 52.0, 1.1)])  # still going: epoch 20 not reached
    args = argparse.Namespace(rows=["recipe", "reprob"], seeds=[0, 1], output=tmp_path)
    proxy.print_table(args)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| recipe")]
    assert [line.split(" | ")[1] for line in lines] == ["0", "1", "mean"]
    assert lines[0].endswith(" | 0.900 |")  # a seed's own row: its last epoch's loss
    mean = [cell.strip(" |") for cell in lines[2].split(" | ")]
    assert mean[2:4] == ["51.00", ""] and mean[-1] == "1.200"  # the loss at epoch 10 too
    assert len(mean) == 2 + 2 + 1  # columns to epoch 20, the longest run's, and the loss

    finished("epochs200", 0, [(150, 70.0, 0.8), (200, 71.0, 0.7)])
    proxy.print_table(argparse.Namespace(rows=["epochs200"], seeds=[0], output=tmp_path))
    header, _, line = capsys.readouterr().out.strip().splitlines()[-3:]
    assert header.split(" | ")[-3:] == ["150", "200", "last train loss |"]
    assert line.endswith(" | 70.00 | 71.00 | 0.700 |")

    # a run whose last evaluation is not one of the report's epochs still shows its end
    finished("epochs134", 0, [(100, 75.0, 0.8), (130, 76.0, 0.75), (134, 76.5, 0.7)])
    proxy.print_table(argparse.Namespace(rows=["epochs134"], seeds=[0], output=tmp_path))
    header, _, line = capsys.readouterr().out.strip().splitlines()[-3:]
    assert header.split(" | ")[-3:] == ["100", "134", "last train loss |"]
    assert line.endswith(" | 75.00 | 76.50 | 0.700 |")


def test_the_speedrun_proxy_starts_the_next_run_as_soon_as_any_one_ends(monkeypatch, tmp_path):
    """Rows of different lengths (134 and 200 epochs): the runner had waited for each pair to
    end before starting the next, a core idle while the longer run went on. Here the first run
    waits until the third has started, which only a runner that fills a freed slot does."""
    import argparse
    import threading

    proxy = speedrun_proxy(monkeypatch)
    third_started = threading.Event()
    started = []
    real_run_one = proxy.run_one

    def run_one(args, name, seed):
        started.append((name, seed))
        if (name, seed) == ("recipe", 0):
            assert third_started.wait(timeout=30), "the third run waited for the first to end"
        if (name, seed) == ("recipe", 1):
            third_started.set()

    monkeypatch.setattr(proxy, "run_one", run_one)
    args = argparse.Namespace(rows=["recipe", "reprob"], seeds=[0, 1], parallel=2)
    proxy.run_rows(args)
    assert sorted(started) == [("recipe", 0), ("recipe", 1), ("reprob", 0), ("reprob", 1)]

    # one run: its command's output in the log beside its run folder
    monkeypatch.setattr(proxy, "command", lambda *a, **k: [sys.executable, "-c", "print('ran')"])
    args = argparse.Namespace(data="data", output=tmp_path, threads=1, train_args=[])
    real_run_one(args, "recipe", 0)
    assert (tmp_path / "recipe-seed0.log").read_text() == "ran\n"


def test_the_speedrun_proxy_resumes_a_run_stopped_part_way_and_keeps_a_finished_one(
    monkeypatch, tmp_path, capsys
):
    """A 300-epoch row outlasts a session: run again, a run folder with a checkpoint continues
    with train.py --resume (its log appended to, not overwritten), where it had failed on the
    folder it found; a run that has done its epochs is kept, and nothing is started for it."""
    import argparse

    from vit.training.checkpoint import save_yaml, write_metrics_csv

    proxy = speedrun_proxy(monkeypatch)
    commands = []

    def run(cmd, stdout, **kwargs):
        commands.append(cmd)
        stdout.write("resumed\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(proxy.subprocess, "run", run)

    def checkpointed(name, last_epoch, planned_epochs):
        folder = tmp_path / f"{name}-seed0"
        folder.mkdir()
        save_yaml(dict(epochs=planned_epochs), folder / "config.yaml")  # as train.py records it
        (folder / "training_state.pt").write_bytes(b"")
        history = [dict(epoch=e, ema_top1=0.5, train_loss=1.0) for e in range(1, last_epoch + 1)]
        write_metrics_csv(history, folder / "metrics.csv")
        (tmp_path / f"{name}-seed0.log").write_text("epoch 1\n")
        return folder

    args = argparse.Namespace(data="data", output=tmp_path, threads=2, train_args=["--no-amp"])
    stopped = checkpointed("mimetic-epochs300", last_epoch=145, planned_epochs=300)
    proxy.run_one(args, "mimetic-epochs300", 0)
    train = str(ROOT / "train.py")
    assert commands == [[sys.executable, train, "--resume", str(stopped), "--threads", "2"]]
    assert (tmp_path / "mimetic-epochs300-seed0.log").read_text() == "epoch 1\nresumed\n"

    checkpointed("recipe", last_epoch=100, planned_epochs=100)
    proxy.run_one(args, "recipe", 0)
    assert len(commands) == 1  # nothing started for it
    assert "recipe seed 0: done (100 epochs), kept" in capsys.readouterr().out
    assert (tmp_path / "recipe-seed0.log").read_text() == "epoch 1\n"


def test_the_pipeline_profile_counts_each_kernel_once_and_names_the_top_ones(monkeypatch):
    """benchmarks/training_pipeline.py's time shares: the GPU is busy over the union of its
    kernels' intervals (two overlapping kernels count once, an annotation spanning them not at
    all: summing each event's device time had counted eager kernels twice), kernels ranked by
    device time, host operations by their own CPU time (from a real CPU profile)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    pipeline = repository_module(monkeypatch, "benchmarks", "training_pipeline")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        a = torch.randn(256, 256)
        (a @ a).sum()

    def kernel(name: str, start: int, end: int, annotation: bool = False):
        return SimpleNamespace(
            name=name,
            device_type=DeviceType.CUDA,
            is_user_annotation=annotation,
            time_range=Interval(start, end),
            self_cpu_time_total=0,
        )

    device = [
        kernel("gemm", 0, 400),
        kernel("gemm", 300, 500),
        kernel("add", 600, 700),
        kernel("## step ##", 0, 1000, annotation=True),
    ]
    shares = pipeline.time_shares([*profile.events(), *device], wall_seconds=1e-3)  # 1,000 us
    assert shares["gpu_busy"] == pytest.approx(0.6)  # 0-500 and 600-700
    assert shares["top_kernels"] == [
        {"name": "gemm", "calls": 2, "share": pytest.approx(0.6)},
        {"name": "add", "calls": 1, "share": pytest.approx(0.1)},
    ]
    host = [op["name"] for op in shares["top_host"]]
    assert "aten::mm" in host and "gemm" not in host and len(host) <= pipeline.TOP
    # scripts/gpu_report.py lists them under the pipeline table
    row = {"config": "c.yaml", "shape": "config", "images_per_s": 1.0, "ms_per_step": 1.0}
    row |= {"data_wait_share": 0.05, "gpu_busy_share": shares["gpu_busy"]}
    row |= {"gpu_top_kernels": shares["top_kernels"], "host_top_ops": shares["top_host"]}
    row |= {"warm_up_seconds": 41.7, "train_loss": 2.1, "captured": {"step": True, "update": None}}
    lines = repository_module(monkeypatch, "scripts", "gpu_report").pipeline_table({"rows": [row]})
    assert "| c.yaml | config | 1 | 1.00 | 5% | 60% | 42 s | 2.100 | step yes |" in lines
    assert "- c.yaml, config, the epoch's GPU by kernel: gemm 60.0%; add 10.0%" in lines
    assert any(line.startswith("- c.yaml, config, the epoch's host by op: ") for line in lines)


def test_host_overhead_benchmark_times_each_eager_part_of_the_speedrun_step():
    """benchmarks/host_overhead.py: a row per eager part, each a positive time, under a header
    naming the CPU."""
    done = subprocess.run(
        [sys.executable, "benchmarks/host_overhead.py", "--repeats", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from vit.inference.cpu_paths import cpu_flags, cpu_name

    assert f"CPU {cpu_name()}, flags {cpu_flags()}" in done.stdout.splitlines()[0]  # the machine
    rows = [line.split("|")[1:3] for line in done.stdout.splitlines() if line.startswith("| ")]
    names = [name.strip() for name, _ in rows[1:]]  # after the header
    assert names == [
        "a step's CutMix and tally: what --graph-step leaves the host",
        "forward and backward, eager: what --graph-step --no-compile replays",
        "optimizer step (muon)",
        "gradient clipping",
        "EMA update",
        "the three, one after the other",
        "a batch, no RandAugment",
        "a batch, no RandAugment, 16 batches a call (the call's time / 16)",
        "a batch, RandAugment x2 eager",
        "a batch, RandAugment x2 eager, 16 batches a call (the call's time / 16)",
    ]
    assert all(float(ms) > 0 for _, ms in rows[1:])


@pytest.mark.slow  # the pipeline benchmark's two rows and a tiny speedrun: ~1 minute on a CPU
def test_gpu_check_speedrun_times_the_whole_command_and_records_every_epoch(image_folder, tmp_path):
    """The speedrun stage's mechanics on the CPU (VIT_GPU_CHECK_CPU=1; tiny settings, no
    compilation): per seed the recipe's whole train.py command timed from before its start, a
    run that fails tried again with the next of VIT_GPU_FALLBACKS, every epoch's time since the
    start within that wall time, the final weights' top-1 with flip TTA beside, then the
    pipeline benchmark's rows, and the records back in $OUT."""
    tiny = ["--batch-size", "8", "--threads", "1", "--no-compile", "--no-graph-update"]
    tiny += ["--epochs", "3", "--time-budget", "none"]  # the recipe's would fill minutes
    heads_3 = "--model-kwargs depth=2 embed_dim=64 num_heads=3"  # 64 wide: no 3 equal heads
    done, records = speedrun_stage(
        image_folder,
        tmp_path,
        VIT_GPU_PIPELINE_ARGS="--images 24 --epochs 1 --shapes 64d-2L-2h-r2 --cache-dir none "
        "--set compile=false graph_update=false threads=1 batch_size=8 workers=0 teacher_width=4 "
        "teacher_epochs=1",
        VIT_GPU_SEEDS="3",
        VIT_GPU_SPEEDRUN_ARGS=" ".join([*tiny, "--eval-interval", "1", heads_3]),
        VIT_GPU_FALLBACKS=" ".join(TINY_KWARGS),
    )
    assert done.returncode == 0, done.stdout[-3000:]
    failed, seed = records["speedrun"]
    assert failed["status"] not in (0, 130) and failed["epochs"] == [] and failed["top1"] is None
    assert failed["flags"][-1] == "num_heads=3"
    assert seed["seed"] == 3 and seed["status"] == 0 and seed["flags"][-1] == "num_heads=2"
    times = [epoch["since_start_s"] for epoch in seed["epochs"]]
    assert len(times) == 3 and 0 < times[0] < times[1] < times[2] <= seed["wall_seconds"]
    assert seed["top1"] == seed["epochs"][-1]["ema_top1"]  # the kept weights: the EMA's
    assert 0 <= seed["tta_top1"] <= 1 and set(seed["first_reached_s"]) == {"90", "93", "94"}
    rows = records["pipeline"]["rows"]
    assert [row["config"] for row in rows] == [
        "configs/cifar10.yaml",
        "configs/cifar10_gpu_speedrun.yaml:graph_update=false",
        "configs/cifar10_gpu_speedrun.yaml",
        "configs/cifar10_gpu_speedrun.yaml:graph_step=true,compile_mode=default",
    ]
    assert all(row["images_per_s"] > 0 and row["gpu_busy_share"] is None for row in rows)
    # the tables printed last (scripts/gpu_report.py): both attempts, the finished one's mean
    attempts = [line for line in done.stdout.splitlines() if line.startswith("| 3 | ")]
    assert len(attempts) == 2 and "| 0 | " in attempts[1]
    assert f"Finished runs: 1; top-1 mean {100 * seed['top1']:.2f}%" in done.stdout
    pipelines = done.stdout.split("Pipelines on CPU, torch ")[1]
    assert pipelines.count("| 64d-2L-2h-r2 |") == 4


@pytest.mark.slow  # four tiny speedruns at once: ~1 minute on a CPU
def test_gpu_check_speedrun_runs_seeds_and_variants_side_by_side(image_folder, tmp_path):
    """VIT_GPU_VARIANTS (as VIT_GPU_SEEDS_TOGETHER=1 for the seeds alone): every seed once per
    variant, all at once (on a GPU, sharing it), each recorded whole (one writer of
    gpu_check.json at a time) with its variant's flags and the number of runs that shared the
    device, their times overlapping; each run's output printed whole, one after the other; the
    finished seeds' mean per variant."""
    tiny = "--batch-size 8 --threads 1 --no-compile --no-graph-update --eval-interval 1"
    tiny += " --time-budget none"  # the recipe's would fill minutes
    done, records = speedrun_stage(
        image_folder,
        tmp_path,
        VIT_GPU_SEEDS="0 1",
        VIT_GPU_VARIANTS="--epochs 1;--epochs 2",
        VIT_GPU_PIPELINE="0",
        VIT_GPU_FALLBACKS="",
        VIT_GPU_SPEEDRUN_ARGS=f"{tiny} {' '.join(TINY_KWARGS)}",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    runs = sorted(records["speedrun"], key=lambda run: (run["seed"], run["flags"][-1]))
    assert [(run["seed"], run["flags"][-2:]) for run in runs] == [
        (seed, ["--epochs", epochs]) for seed in (0, 1) for epochs in ("1", "2")
    ]
    assert [len(run["epochs"]) for run in runs] == [1, 2, 1, 2]
    assert all(run["status"] == 0 and run["at_once"] == 4 for run in runs)
    ends = [run["started_at"] + run["wall_seconds"] for run in runs]
    assert max(run["started_at"] for run in runs) < min(ends)  # they ran at the same time
    assert "runs 0-v1 0-v2 1-v1 1-v2 side by side (CUDA MPS off)" in done.stdout
    outputs = done.stdout.split("side by side (CUDA MPS off)")[1]
    # each run's output whole, to its last line (the summary), before the next one's
    first_run_ends = outputs.index("seed 0 --batch-size")  # 0-v1's summary
    assert outputs.index("seed 0: train.py") < first_run_ends < outputs.index("seed 1: train.py")
    lines = done.stdout.splitlines()
    shared = [line for line in lines if line.startswith("| ") and line.endswith(" | 4 |")]
    assert len(shared) == 4  # the attempts table's last column: 4 runs at once
    means = [line for line in lines if line.startswith("Finished runs: 2; top-1 mean")]
    variants = sorted(line.rsplit(" ", 2)[-2:] for line in means)  # in the order runs ended
    assert variants == [["--epochs", "1"], ["--epochs", "2"]]


def test_gpu_check_pipeline_stage_runs_the_benchmark_alone(image_folder, tmp_path):
    """The pipeline stage: the benchmark's rows (here the speedrun's alone) with no seed run."""
    done, records = speedrun_stage(
        image_folder,
        tmp_path,
        "pipeline",
        VIT_GPU_PIPELINE_ARGS="--configs configs/cifar10_gpu_speedrun.yaml --images 24 --epochs 1 "
        "--shapes 64d-2L-2h-r2 --cache-dir none --set compile=false graph_update=false "
        "threads=1 batch_size=8 teacher_width=4 teacher_epochs=1",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "speedrun" not in records and not (tmp_path / "machine" / "speedrun-0").exists()
    (row,) = records["pipeline"]["rows"]
    assert row["config"] == "configs/cifar10_gpu_speedrun.yaml" and row["images_per_s"] > 0
    assert row["gpu_busy_share"] is None and row["gpu_top_kernels"] is None  # no GPU here


SPEEDRUN = "configs/cifar10_gpu_speedrun.yaml"


def pipeline_row(settings: str, images_per_s: float, warm_up_seconds: float, **more) -> dict:
    """A row of benchmarks/training_pipeline.py's JSON for the speedrun with `settings`."""
    config = f"{SPEEDRUN}:{settings}" if settings else SPEEDRUN
    return {"config": config, "shape": "config", "images_per_s": images_per_s,
            "warm_up_seconds": warm_up_seconds, "train_loss": 2.0, "gpu_busy_share": 0.9,
            **more}  # fmt: skip


def speedrun_chooser(monkeypatch):
    """scripts/choose_speedrun_flags.py as a module."""
    return repository_module(monkeypatch, "scripts", "choose_speedrun_flags")


RECIPE_TIMES = {"time_budget": 290, "eval_interval": 5, "checkpoint_interval": 5}
CHOICE_ROWS = [
    pipeline_row("graph_update=false", 28_000, 45.0),
    # the fastest step, and the compiler's 45 s first: 30,000 x 225 s = 6.75M images
    pipeline_row("graph_step=true,compile_mode=default", 30_000, 45.0),
    # slower, no compiler: 28,000 x 267 s = 7.48M images, ~150 epochs
    pipeline_row("graph_step=true,compile=false,augment_batches=16", 28_000, 3.0),
]


def test_the_speedruns_flags_are_the_row_that_trains_the_most_images_in_its_budget(monkeypatch):
    """scripts/choose_speedrun_flags.py: of the rows that train the recipe's own model and
    finished with a finite loss, the one whose images/s, over the budget's seconds left after
    the start and its first epoch (compiling), trains the most images; its settings as
    train.py's flags, evaluations spaced out where the epochs grow, mimetic initialisation from
    134 epochs; seeds side by side only where the GPU is idle most of that row's step."""
    chooser = speedrun_chooser(monkeypatch)
    refused = [
        pipeline_row("batch_size=1024", 90_000, 10.0, train_loss=float("nan")),
        {"config": SPEEDRUN, "shape": "config", "error": "RuntimeError: capture"},
        pipeline_row("", 90_000, 10.0) | {"shape": "192d-9L-12h-r2"},
        {**pipeline_row("", 90_000, 10.0), "config": "configs/cifar10.yaml"},
        pipeline_row("model_kwargs={depth: 2}", 90_000, 10.0),  # no flag for a dict
    ]
    choice = chooser.choose({"rows": [*CHOICE_ROWS, *refused]}, RECIPE_TIMES)
    assert choice["row"] == f"{SPEEDRUN}:graph_step=true,compile=false,augment_batches=16"
    assert choice["flags"] == [
        "--graph-step", "--no-compile", "--augment-batches", "16",
        "--eval-interval", "10", "--checkpoint-interval", "10",  # ~150 epochs: every 10th
        "--mimetic-init", "--patch-embed-init", "default",  # and past 134 epochs the switch
        "--aa-n", "3", "--reprob", "0.25",
    ]  # fmt: skip
    assert choice["expected_images"] == 28_000 * 267 and not choice["together"]  # busy 90%
    assert [row["why"].split(":")[0] for row in choice["refused"]] == [
        "no finite training loss (nan)", "failed", "another model (192d-9L-12h-r2)",
        "not the recipe (configs/cifar10.yaml)",
        "'model_kwargs={depth", # : 2}': a row's setting here takes one value, not {...}
    ]  # fmt: skip
    assert chooser.choose({"rows": refused}, RECIPE_TIMES)["row"] is None
    # the recipe as it is, ~90 epochs (every 5th evaluated, as the recipe has it), its step
    # leaving the GPU idle 80% of the time: no flags, seeds side by side
    idle = pipeline_row("", 20_000, 45.0, gpu_busy_share=0.2)
    idle = chooser.choose({"rows": [idle]}, RECIPE_TIMES)
    assert idle["flags"] == [] and idle["together"]
    # a pace that fits 180 epochs: mimetic initialisation (it pays with passes), with
    # timm's patch embedding (whitened and mimetic together gained nothing over mimetic alone),
    # and more augmentation (it paid over 200 and 300 epochs, not over 100)
    fast = pipeline_row("graph_step=true", 40_000, 45.0)
    fast = chooser.choose({"rows": [fast]}, RECIPE_TIMES)
    assert fast["expected_epochs"] == 180.0
    assert fast["flags"][-7:] == [
        "--mimetic-init", "--patch-embed-init", "default", "--aa-n", "3", "--reprob", "0.25",
    ]  # fmt: skip
    # a teacher that trained 4 s over a fifth of the images takes 20 s of a whole run's budget
    taught = pipeline_row("graph_step=true", 40_000, 45.0, teacher_seconds=4.0, train_images=10_000)
    assert chooser.choose({"rows": [taught]}, RECIPE_TIMES)["expected_images"] == 40_000 * 205
    # from 134 epochs, the fewest the switch was measured paying at with the recipe's teacher
    at_least = pipeline_row("graph_step=true", 29_800, 45.0)  # 134.1 epochs
    assert "--mimetic-init" in chooser.choose({"rows": [at_least]}, RECIPE_TIMES)["flags"]
    slower = pipeline_row("graph_step=true", 29_700, 45.0)  # 133.65 epochs: none of them
    slower = chooser.choose({"rows": [slower]}, RECIPE_TIMES)["flags"]
    assert "--aa-n" not in slower and "--mimetic-init" not in slower


def test_the_speedruns_choice_refuses_a_row_whose_loss_strays_from_its_batchs(monkeypatch):
    """Of three or more rows of one batch (the same images from the same seed), one whose loss
    strays more than 0.1 from their median trains otherwise (a stale input replayed, say): not
    chosen, however fast; a row of another batch, with no two others to compare with, keeps
    its own loss."""
    chooser = speedrun_chooser(monkeypatch)
    rows = [{**row, "batch_size": 512} for row in CHOICE_ROWS]
    rows[2] |= {"train_loss": 1.2, "images_per_s": 90_000}  # the fastest, and wrong
    larger = pipeline_row("batch_size=1024", 40_000, 45.0, batch_size=1024, train_loss=2.2)
    choice = chooser.choose({"rows": [*rows, larger]}, RECIPE_TIMES)
    assert choice["row"] == f"{SPEEDRUN}:batch_size=1024"
    (stray,) = choice["refused"]
    assert stray["config"] == rows[2]["config"]
    assert "its loss 1.200 is more than 0.1 from the median 2.000" in stray["why"]


def test_the_speedrun_chooser_prints_the_seeds_way_and_the_flags(tmp_path):
    """The command gpu_check.sh reads: 0 or 1 (side by side), then the flags, on stdout; a
    budget shorter than the recipe's (a shorter box) weighed instead; exit status 2, nothing on
    stdout and the reason on stderr where no row qualifies."""
    rows_file = tmp_path / "pipeline.json"
    rows_file.write_text(json.dumps({"rows": [pipeline_row("graph_step=true", 40_000, 45.0)]}))
    chooser = [sys.executable, str(ROOT / "scripts" / "choose_speedrun_flags.py")]
    command = [*chooser, str(rows_file), "--time-budget", "145"]
    done = subprocess.run([*command, "--json", str(tmp_path / "c.json")], capture_output=True)
    assert done.returncode == 0 and done.stdout.decode().split("\n") == ["0", "--graph-step", ""]
    chosen = json.loads((tmp_path / "c.json").read_text())
    assert chosen["time_budget"] == 145 and chosen["expected_epochs"] == 64.0  # 80 s x 40,000
    rows_file.write_text(json.dumps({"rows": []}))
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "" and "qualifies" in done.stderr


@pytest.mark.slow  # the pipeline benchmark's two tiny rows, then a tiny speedrun: ~1 minute
def test_gpu_check_speedrun_auto_measures_the_pipeline_then_trains_with_its_choice(
    image_folder, tmp_path
):
    """VIT_GPU_SPEEDRUN_ARGS="auto FLAGS": the pipeline benchmark first (once: not again after
    the seeds), the flags chosen from its rows and recorded, the seeds trained with them and
    FLAGS after them, one after the other where the GPU's share is unknown (a CPU)."""
    model = '{"depth":1,"embed_dim":16,"num_heads":2,"global_pool":"avg","class_token":false}'
    tiny = "--batch-size 8 --threads 1 --epochs 1 --time-budget none"
    done, records = speedrun_stage(
        image_folder,
        tmp_path,
        VIT_GPU_PIPELINE_ARGS=f"--configs {SPEEDRUN}:graph_update=false "
        f"{SPEEDRUN}:graph_step=true,compile=false --images 24 --epochs 1 --shapes config "
        f"--cache-dir none --set compile=false threads=1 batch_size=8 teacher_width=4 "
        f"teacher_epochs=1 model_kwargs={model}",
        VIT_GPU_SEEDS="0 1",
        VIT_GPU_FALLBACKS="",
        VIT_GPU_SPEEDRUN_ARGS=f"auto {tiny} {' '.join(TINY_KWARGS)}",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    rows = records["pipeline"]["rows"]
    assert len(rows) == 2 and all(row["train_loss"] > 0 for row in rows)
    assert done.stdout.count("model config: batch 8") == 2  # measured once, two rows
    choice = records["speedrun_choice"]
    # the recipe's teacher trained over the row's 24 images; a run's, over all 50,000
    teacher = {row["config"]: row["teacher_seconds"] * 50_000 / row["train_images"] for row in rows}
    assert all(row["teacher_seconds"] > 0 and row["train_images"] == 24 for row in rows)

    def images(row: dict) -> float:  # none where the teacher's time would take the whole budget
        seconds = 290 - 20 - row["warm_up_seconds"] - teacher[row["config"]]
        return row["images_per_s"] * max(0.0, seconds)

    # the chosen row trains the most images (on a busy machine the teacher's 24 images, scaled to
    # 50,000, may fill both rows' budgets: then any of the tied rows)
    (best,) = [row for row in rows if row["config"] == choice["row"]]
    assert images(best) == max(map(images, rows)) and not choice["together"]
    counted = {row["config"]: row["expected_images"] for row in choice["candidates"]}
    assert counted == {row["config"]: round(images(row)) for row in rows}
    expected = ["--no-graph-update"] if "graph_update" in best["config"] else ["--graph-step"]
    expected += ["--no-compile"] if "compile=false" in best["config"] else []
    for seed, run in enumerate(records["speedrun"]):
        assert run["seed"] == seed and run["status"] == 0 and run["at_once"] == 1
        assert run["flags"] == [*expected, *tiny.split(), *TINY_KWARGS]
    assert f"The speedrun's flags, from {best['config']}: " in done.stdout


@pytest.mark.slow  # a tiny speedrun: ~30 s on a CPU
def test_gpu_check_speedrun_auto_leaves_a_seed_its_time_before_the_pipeline(image_folder, tmp_path):
    """VIT_GPU_SPEEDRUN_ARGS=auto: the benchmark before the seeds gets what VIT_GPU_DEADLINE
    leaves after a seed's shortest box and its TTA (here under the minute a benchmark needs: not
    started), so that a benchmark that runs long cannot take the call's seeds with it; with no
    rows to choose from, the recipe as it is (the FLAGS after auto) trains."""
    tiny = "--batch-size 8 --threads 1 --no-compile --no-graph-update --epochs 1"
    done, records = speedrun_stage(
        image_folder,
        tmp_path,
        # 400 s less the start (5-25 s), a seed's shortest box (300) and the TTA's 45: under a
        # minute for the benchmark; the seed's box the default 330 (no budget of the box's own)
        VIT_GPU_DEADLINE="400",
        VIT_GPU_SPEEDRUN_MIN_SECONDS="300",
        VIT_GPU_FALLBACKS="",
        VIT_GPU_SPEEDRUN_ARGS=f"auto {tiny} --time-budget none {' '.join(TINY_KWARGS)}",
    )
    assert done.returncode == 1, done.stdout[-3000:]  # the choice failed: no rows
    assert "the pipeline benchmark: not started" in done.stdout and "pipeline" not in records
    (seed,) = records["speedrun"]
    assert seed["status"] == 0 and seed["flags"][: len(tiny.split())] == tiny.split()
    assert "the speedrun's flags: --batch-size 8" in done.stdout


@pytest.mark.slow  # a tiny speedrun that fills a 40 s budget: ~50 s on a CPU
def test_gpu_check_gives_a_box_shorter_than_the_recipes_budget_a_budget_inside_it(
    image_folder, tmp_path
):
    """A time box too short for the recipe's time_budget (290 s; here VIT_GPU_SPEEDRUN_SECONDS
    is 60, the shortest it starts): the run gets --time-budget 20 s short of the box, plans its
    epochs to end inside it and ends (status 0) rather than being stopped by the box before its
    schedule's end."""
    # (a first guess of 6 epochs: its timed 5 all warmup, as the recipe's 100 have them)
    tiny = "--batch-size 8 --threads 1 --no-compile --no-graph-update --epochs 6 --warmup-epochs 5"
    done, records = speedrun_stage(
        image_folder,
        tmp_path,
        VIT_GPU_SPEEDRUN_SECONDS="60",
        VIT_GPU_PIPELINE="0",
        VIT_GPU_FALLBACKS="",
        VIT_GPU_SPEEDRUN_ARGS=f"{tiny} {' '.join(TINY_KWARGS)}",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    (seed,) = records["speedrun"]
    assert seed["flags"][-2:] == ["--time-budget", "40"] and seed["time_box_s"] == 60
    assert seed["status"] == 0 and seed["wall_seconds"] < 60
    assert len(seed["epochs"]) > 6  # more than the first guess: the budget filled
    # a --time-budget of the caller's own is kept: `none` with --epochs 1 was refused by
    # train.py ("--epochs 1 would end the run first") once a short box added its own
    own = f"{tiny} --epochs 1 --warmup-epochs 0 --time-budget none {' '.join(TINY_KWARGS)}"
    (tmp_path / "own").mkdir()
    done, records = speedrun_stage(
        image_folder,
        tmp_path / "own",
        VIT_GPU_SPEEDRUN_SECONDS="60",
        VIT_GPU_PIPELINE="0",
        VIT_GPU_FALLBACKS="",
        VIT_GPU_SPEEDRUN_ARGS=own,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    (seed,) = records["speedrun"]
    assert seed["flags"] == own.split() and seed["status"] == 0 and len(seed["epochs"]) == 1


def test_gpu_check_speedrun_starts_nothing_it_has_no_time_for(image_folder, tmp_path):
    """VIT_GPU_DEADLINE: a seed whose time box would be under a minute is not started (status
    75, recorded), nor is the benchmark, and the stage says it failed."""
    # 50 s, less the TTA's 45: under the minute a run needs
    done, records = speedrun_stage(image_folder, tmp_path, VIT_GPU_DEADLINE="50")
    assert done.returncode == 1, done.stdout[-3000:]
    (seed,) = records["speedrun"]
    assert seed["seed"] == 0 and seed["status"] == 75 and seed["epochs"] == []
    assert "pipeline" not in records and not (tmp_path / "machine" / "speedrun-0").exists()
    assert "pipeline benchmark: not started" in done.stdout
    assert "| 0 | (the recipe) | 75 | " in done.stdout


def test_gpu_check_tests_stage_starts_no_tests_it_has_no_time_for(image_folder, tmp_path):
    """VIT_GPU_DEADLINE holds for the tests stage too (after the seeds, say): with under 30 s
    left it starts no pytest, records no counts and fails no stage."""
    done, records = speedrun_stage(image_folder, tmp_path, "tests", VIT_GPU_DEADLINE="20")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "the tests: not started" in done.stdout and "tests" not in records


@pytest.mark.slow  # three tiny fine-tuning runs through benchmarks/finetune_table.py: ~1 minute
def test_gpu_check_finetune_packs_a_backbone_and_tables_its_rows(image_folder, tmp_path):
    """--pack-backbone halves a transformers folder's weights to bfloat16 (what one call may
    carry); the finetune stage's mechanics on the CPU (VIT_GPU_CHECK_CPU=1, a tiny backbone of
    our own format, tiny settings): its three rows and the probe's epoch 0 in the JSON."""
    from safetensors.torch import save_file

    folder = tmp_path / "dinov2-tiny"
    folder.mkdir()
    save_file({"w": torch.ones(4, 4)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "dinov2"}')
    packed = gpu_check("--pack-backbone", str(folder), VIT_GPU_BACKBONE_BUILD=str(tmp_path / "bb"))
    assert packed.returncode == 0, packed.stderr
    halved = load_file(tmp_path / "bb" / "dinov2-tiny" / "model.safetensors")
    assert halved["w"].dtype == torch.bfloat16
    assert (tmp_path / "bb" / "dinov2-tiny" / "config.json").is_file()

    build = tmp_path / "build"
    pack_images(image_folder, build)
    backbone = tmp_path / "backbone.safetensors"
    torch.manual_seed(0)
    vit.save_weights(
        vit.create_model("vit_cifar_patch4_32", depth=2, embed_dim=32, num_heads=2), backbone
    )
    tiny = "--img-size 32 --train-images 24 --test-images 12 --epochs 1 --batch-size 8 --threads 1"
    done = gpu_check(
        str(tmp_path / "machine"),
        "finetune",
        VIT_GPU_CHECK_CPU="1",
        VIT_GPU_BUILD=str(build),
        VIT_GPU_DATA=str(tmp_path / "data"),
        VIT_GPU_WORKERS="0",
        VIT_GPU_BACKBONE=str(backbone),
        VIT_GPU_BACKBONE_MODEL="vit_cifar_patch4_32",
        VIT_GPU_FINETUNE_ARGS=f"{tiny} --model-kwargs depth=2 embed_dim=32 num_heads=2",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    records = json.loads((tmp_path / "machine" / "gpu_check.json").read_text())
    rows = records["finetune"]["rows"]
    assert [row["row"] for row in rows] == [
        "probe, then full with layer decay 0.65",
        "head only (--trainable-blocks 0)",
        "full, layer decay 0.65",
    ]
    assert 0 <= rows[0]["probe_top1"] <= 1 and all(0 <= row["top1"] <= 1 for row in rows)
