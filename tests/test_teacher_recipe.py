"""--teacher-recipe: the teacher's schedules, parameter groups, lookahead and airbench's
network changes (vit/training/teacher_recipe.py); the teacher learning by each recipe is in
test_distillation.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from vit.data.batch_pipeline import InMemoryBatches
from vit.models.cnn_teacher import CnnTeacher, dirac_init_, whiten_stem_
from vit.training.distillation import teacher_loader_settings
from vit.training.settings import TrainConfig
from vit.training.teacher_recipe import (
    RECIPES,
    Lookahead,
    lr_factor,
    param_groups,
    peak_lr,
    prepare,
    train_teacher,
)
from vit.utils.process_group import DistInfo


def test_every_recipe_is_a_choice_of_the_flag():
    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "teacher_recipe")
    assert set(field.metadata["flag"]["choices"]) == set(RECIPES)
    assert TrainConfig().teacher_recipe in RECIPES


def test_dawnbench_schedule_is_the_one_cycle_from_zero_and_airbench_its_own_triangle():
    total = 100
    dawn = [lr_factor(RECIPES["dawnbench"], s, total) for s in range(total)]
    # the first recipe's: up from ~0 to 1 over 20 steps, then down to ~0
    assert dawn[0] == pytest.approx(1 / 20) and dawn[19] == 1.0
    assert dawn[-1] == pytest.approx(1 / 81) and max(dawn) == 1.0
    air = [lr_factor(RECIPES["airbench"], s, total) for s in range(total)]
    assert air[0] == pytest.approx(0.2 + 0.8 / 23) and air[22] == pytest.approx(1.0)
    assert air[-1] == pytest.approx(0.07 + 0.93 / 78)
    assert all(a <= b for a, b in zip(air[:22], air[1:23], strict=True))  # rises, then falls
    assert all(a >= b for a, b in zip(air[22:], air[23:], strict=False))


def test_lookahead_moves_the_module_to_a_running_average_of_its_weights_and_statistics():
    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    start = {k: v.clone() for k, v in module.state_dict().items()}
    lookahead = Lookahead(module)
    with torch.no_grad():
        for t in module.state_dict().values():
            if t.is_floating_point():
                t.add_(1.0)
    lookahead.pull(0.75)  # a quarter of the way from the average to the module
    for key, value in module.state_dict().items():
        if value.is_floating_point():
            assert torch.allclose(value, start[key] + 0.25)
    with torch.no_grad():
        module[0].weight.add_(4.0)
    lookahead.pull(1.0)  # 1: back to the average, whatever the module did since
    assert torch.allclose(module[0].weight, start["0.weight"] + 0.25)
    assert torch.equal(module[1].num_batches_tracked, start["1.num_batches_tracked"])


def test_airbench_groups_give_the_norms_shifts_64x_the_rate_and_the_same_decay_a_step():
    teacher = prepare(CnnTeacher(10, width=4, channel_mult=(1, 4, 4), stem="whiten"),
                      RECIPES["airbench"])  # fmt: skip
    groups = param_groups(teacher, RECIPES["airbench"], peak=0.5)
    trained = [p for p in teacher.parameters() if p.requires_grad]
    grouped = [p for g in groups for p in g["params"]]
    assert len(grouped) == len(trained) and {id(p) for p in grouped} == {id(p) for p in trained}
    weights, shifts, others, stem = groups
    assert shifts["peak"] == 64 * weights["peak"]
    assert shifts["peak"] * shifts["weight_decay"] == pytest.approx(
        weights["peak"] * weights["weight_decay"]
    )
    assert stem["params"] == [teacher.stem.conv.bias] and stem["stem_bias"]
    # the norms' scales are frozen, so the shifts are every norm's trained parameter
    norms = [m for m in teacher.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(shifts["params"]) == len(norms) and others["params"] == [teacher.head.bias]
    assert all(m.momentum == 0.4 and not m.weight.requires_grad for m in norms)
    dawn = param_groups(CnnTeacher(10, width=4), RECIPES["dawnbench"], peak=0.5)
    assert [g["weight_decay"] for g in dawn] == [5e-4, 0.0, 0.0, 0.0]


def test_the_peak_rate_follows_the_batch_of_every_process_together():
    """Under torchrun DDP averages the processes' gradients, so one step is over all their
    images: two processes of 64 take the rate of one process of 128, not of 64."""
    air = RECIPES["airbench"]
    assert peak_lr(air, batch_size=512, info=DistInfo()) == pytest.approx(air.lr)
    two = peak_lr(air, batch_size=64, info=DistInfo(rank=1, world_size=2, local_rank=1))
    assert two == pytest.approx(peak_lr(air, batch_size=128, info=DistInfo()))
    assert two == pytest.approx(air.lr / 4)


def test_identity_started_convs_pass_their_input_channels_through():
    torch.manual_seed(0)
    teacher = dirac_init_(CnnTeacher(10, width=4, channel_mult=(1, 4, 4)))
    conv = teacher.stages[1].conv2[0]  # 16 -> 16 channels
    x = torch.randn(2, 16, 8, 8)
    assert torch.allclose(conv(x), x, atol=1e-6)
    widening = teacher.stages[1].conv1[0]  # 4 -> 16: the first 4 outputs are the inputs
    x = torch.randn(2, 4, 8, 8)
    y = widening(x)
    assert torch.allclose(y[:, :4], x, atol=1e-6) and not torch.allclose(y[:, 4:8], x)


def test_airbench_trains_shifts_not_norm_scales_and_stops_the_stem_bias_when_told():
    torch.manual_seed(0)
    images = torch.randint(0, 255, (64, 32, 32, 3), dtype=torch.uint8).numpy()
    labels = (torch.arange(64) % 3).numpy()
    loader = InMemoryBatches(images, labels, batch_size=16, mean=(0.5,) * 3, std=(0.25,) * 3)
    recipe = dataclasses.replace(RECIPES["airbench"], stem_bias_steps=0.0)
    teacher = CnnTeacher(3, width=4, stem="whiten", **recipe.network)
    whiten_stem_(teacher, [(torch.from_numpy(images).permute(0, 3, 1, 2) / 255 - 0.5) / 0.25])
    stem_bias = teacher.stem.conv.bias.clone()
    shift = teacher.stages[0].conv1[1].bias.clone()
    train_teacher(
        teacher, loader, recipe=recipe, epochs=2, device=torch.device("cpu"), amp=False,
        amp_dtype="bfloat16", info=DistInfo(),
    )  # fmt: skip
    assert torch.equal(teacher.stem.conv.bias, stem_bias)
    assert not torch.equal(teacher.stages[0].conv1[1].bias, shift)
    norms = [m for m in teacher.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in norms)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_the_teachers_batches_take_the_recipes_padding_and_otherwise_the_runs():
    run = TrainConfig(crop_pad=3, aa="randaug", reprob=0.25)
    air = teacher_loader_settings(run, RECIPES["airbench"])
    assert (air.crop_pad, air.crop_pad_mode, air.aa, air.reprob) == (2, "reflect", "none", 0.0)
    dawn = teacher_loader_settings(run, RECIPES["dawnbench"])
    assert (dawn.crop_pad, dawn.crop_pad_mode) == (3, "constant")
    # --teacher-aa randaug: the run's RandAugment (its --aa-n ops), still no erasing
    run = dataclasses.replace(run, teacher_aa="randaug", aa_n=3)
    taught = teacher_loader_settings(run, RECIPES["airbench"])
    assert (taught.aa, taught.aa_n, taught.reprob, taught.crop_pad) == ("randaug", 3, 0.0, 2)
