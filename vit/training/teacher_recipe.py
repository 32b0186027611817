"""How the distillation teacher trains: `--teacher-recipe dawnbench|airbench`.

The teacher (`vit.models.cnn_teacher.CnnTeacher`) trains with SGD and Nesterov momentum on the
mean cross-entropy of a batch with label smoothing 0.2, its learning rate given for batches of
512 and scaled in proportion to a step's images (under torchrun, every process's together). The
two recipes, per batch of 512 images:

                              dawnbench            airbench
    peak learning rate        0.4                  0.75
    momentum                  0.9                  0.85
    L2 (SGD's weight_decay)   5e-4, weights only   1.33e-3, every parameter trained (a norm's
                                                   shift divided by 64: the same decay a step)
    norms' shifts' rate       x1                   x64
    norms' scales             trained              frozen at 1
    norms' running stats      momentum 0.1         momentum 0.4
    schedule (x peak)         0 -> 1 at 20% -> 0   0.2 -> 1 at 23% -> 0.07
    logits                    x1                   x1/9
    each stage's first pool   after norm and GELU  between conv and norm
    3x3 convs' first filters  random               identity (dirac)
    lookahead                 -                    from 30% of the steps, every 5 steps
    whitening stem's bias     trained throughout   trained for the first 30% of the steps
    pad-crop                  the run's (4, black) 2 pixels, mirrored (reflect)

dawnbench is the first teacher's (the DAWNBench CIFAR-10 ResNets' one cycle, Page 2018).
airbench is Keller Jordan's airbench94 recipe for this very network (tysam-code's hlb-cifar10
before it), which reports 94.01% on CIFAR-10 (the lossless images; mean of 1,000 runs, with
test-time flips and 1-pixel shifts) in 9.9 epochs of 1,024-image batches, rewritten from its
parametrisation (a summed loss, a learning rate per 1,024 images divided by
1 + 1/(1 - momentum), a weight decay per step) into this one: a mean loss, SGD's own learning
rate and L2. It leaves out the head's bias (kept here) and uses eps 1e-12 in the norms (1e-5
here). Why its parts help:
with every conv followed by a batch norm whose scale is frozen, the convs' weights are scale
invariant, so the L2 sets their effective learning rate, and the norms' shifts, the only way
left to move a channel's threshold, learn fast; the 1/9 keeps the logits small so that label
smoothing's targets are reached late; identity filters make each conv start as a residual;
lookahead pulls the weights back to their running average, stronger as training ends.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..inference.precision import autocast
from ..models.cnn_teacher import CnnTeacher, dirac_init_
from ..utils import process_group
from ..utils.process_group import DistInfo

logger = logging.getLogger("vit")

REFERENCE_BATCH = 512  # the batch the learning rates below are given for


@dataclass(frozen=True)
class TeacherRecipe:
    """One teacher recipe; the module's notes say what each field does and their values."""

    lr: float  # the peak learning rate for batches of REFERENCE_BATCH, in proportion to the batch
    momentum: float  # SGD's, Nesterov
    weight_decay: float  # SGD's weight_decay (L2) on the convs' and the head's weights
    decay_all: bool  # the biases and the norms' shifts decay too, as much a step as the weights
    shift_lr_scale: float  # the norms' shifts learn this many times faster than the rest
    start_lr: float  # the schedule, in units of the peak: from start_lr (one step before the first)
    warmup: float  # ... rising linearly to 1 at this fraction of the steps ...
    end_lr: float  # ... falling linearly to end_lr (one step after the last)
    label_smoothing: float
    logit_scale: float  # the head's logits times this (`CnnTeacher.logit_scale`)
    pool_before_norm: bool  # each stage's pool before its first norm (`CnnTeacher`'s)
    frozen_norm_scale: bool  # the norms' scales stay at 1
    norm_momentum: float  # the norms' running statistics' momentum, PyTorch's convention
    dirac_init: bool  # each 3x3 conv's first filters start as the identity
    lookahead_start: float | None  # lookahead from this fraction of the steps on (None: off)
    stem_bias_steps: float  # the fraction of the steps a whitening stem's bias trains for
    crop_pad: int | None  # the teacher's batches' --crop-pad (None: the run's)
    crop_pad_mode: str | None  # ... and --crop-pad-mode (None: the run's)

    @property
    def network(self) -> dict:
        """The `CnnTeacher` arguments that are the recipe's, not the shape's."""
        return {"logit_scale": self.logit_scale, "pool_before_norm": self.pool_before_norm}


RECIPES = {
    "dawnbench": TeacherRecipe(
        lr=0.4,
        momentum=0.9,
        weight_decay=5e-4,
        decay_all=False,
        shift_lr_scale=1.0,
        start_lr=0.0,
        warmup=0.2,
        end_lr=0.0,
        label_smoothing=0.2,
        logit_scale=1.0,
        pool_before_norm=False,
        frozen_norm_scale=False,
        norm_momentum=0.1,
        dirac_init=False,
        lookahead_start=None,
        stem_bias_steps=1.0,
        crop_pad=None,
        crop_pad_mode=None,
    ),
    # airbench94's: lr 11.5 per 1,024 images of a summed loss over 1 + 1/(1 - 0.85), x 512;
    # its weight decay 0.0153 per 1,024 images a step, over that learning rate
    "airbench": TeacherRecipe(
        lr=11.5 * REFERENCE_BATCH / (1024 * (1 + 1 / (1 - 0.85))),
        momentum=0.85,
        weight_decay=0.0153 / 11.5,
        decay_all=True,
        shift_lr_scale=64.0,
        start_lr=0.2,
        warmup=0.23,
        end_lr=0.07,
        label_smoothing=0.2,
        logit_scale=1 / 9,
        pool_before_norm=True,
        frozen_norm_scale=True,
        norm_momentum=0.4,
        dirac_init=True,
        lookahead_start=0.3,
        stem_bias_steps=0.3,
        crop_pad=2,
        crop_pad_mode="reflect",
    ),
}

# lookahead (airbench's constants): every LOOKAHEAD_EVERY steps the weights (and the norms'
# running statistics) move to their running average, itself kept as
#   average <- rho * average + (1 - rho) * weights,   rho = LOOKAHEAD_BASE ** EVERY * (t / T) ** POW
# at step t of T: hardly any averaging early, ~0.77 at the end
LOOKAHEAD_EVERY = 5
LOOKAHEAD_BASE = 0.95
LOOKAHEAD_POW = 3.0


def lr_factor(recipe: TeacherRecipe, step: int, total: int) -> float:
    """The learning rate at `step` (0-based) of `total`, in units of the peak: a line from
    start_lr up to 1 at the warmup's end, then a line down to end_lr, each end one step outside
    the run (step 0 already a step up the line: 0.05 for dawnbench's 0 at 100 steps, 0.235 for
    airbench's 0.2; the last step a step above end_lr)."""
    warmup = max(1, round(recipe.warmup * total))
    rising = recipe.start_lr + (1 - recipe.start_lr) * (step + 1) / warmup
    falling = recipe.end_lr + (1 - recipe.end_lr) * (total - step) / (total - warmup + 1)
    return min(rising, falling)


class Lookahead:
    """A running average of a module's floating-point state (weights and the norms' running
    statistics) that the module is moved to: `pull(rho)` updates the average towards the
    module, then copies it into the module."""

    def __init__(self, module: nn.Module) -> None:
        self.state = [t for t in module.state_dict().values() if t.is_floating_point()]
        self.average = [t.detach().clone() for t in self.state]

    @torch.no_grad()
    def pull(self, rho: float) -> None:
        torch._foreach_lerp_(self.average, self.state, 1.0 - rho)
        torch._foreach_copy_(self.state, self.average)


def prepare(teacher: CnnTeacher, recipe: TeacherRecipe) -> CnnTeacher:
    """The recipe's changes to a new teacher before its first step: the norms' momentum and
    frozen scales, identity filters. In place."""
    for module in teacher.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = recipe.norm_momentum
            if recipe.frozen_norm_scale:
                module.weight.requires_grad_(False)
    if recipe.dirac_init:
        dirac_init_(teacher)
    return teacher


def param_groups(teacher: CnnTeacher, recipe: TeacherRecipe, peak: float) -> list[dict]:
    """SGD's groups: the weights, the norms' shifts, the rest (biases, norms' scales), and a
    whitening stem's bias alone (its learning rate goes to 0 after stem_bias_steps); each with
    its "peak" learning rate, which the schedule scales."""
    shifts = {id(m.bias) for m in teacher.modules() if isinstance(m, nn.BatchNorm2d)}
    stem_bias = getattr(getattr(teacher.stem, "conv", None), "bias", None)
    groups = {"weights": [], "shifts": [], "others": [], "stem_bias": []}
    for p in teacher.parameters():
        if not p.requires_grad:
            continue
        if p is stem_bias:
            groups["stem_bias"].append(p)
        elif p.ndim > 1:
            groups["weights"].append(p)
        else:
            groups["shifts" if id(p) in shifts else "others"].append(p)
    decay = recipe.weight_decay if recipe.decay_all else 0.0
    return [
        {"params": groups["weights"], "peak": peak, "weight_decay": recipe.weight_decay},
        {
            "params": groups["shifts"],
            "peak": peak * recipe.shift_lr_scale,
            "weight_decay": decay / recipe.shift_lr_scale,  # lr x decay: the weights' a step
        },
        {"params": groups["others"], "peak": peak, "weight_decay": decay},
        {"params": groups["stem_bias"], "peak": peak, "weight_decay": decay, "stem_bias": True},
    ]


def peak_lr(recipe: TeacherRecipe, *, batch_size: int, info: DistInfo) -> float:
    """The recipe's peak learning rate for one step over `batch_size` images on each of
    info.world_size processes: DDP averages their gradients, so a step is over all of them."""
    return recipe.lr * batch_size * info.world_size / REFERENCE_BATCH


def train_teacher(
    teacher: CnnTeacher,
    loader,
    *,
    recipe: TeacherRecipe,
    epochs: int,
    device: torch.device,
    amp: bool,
    amp_dtype: str,
    info: DistInfo,
) -> float:
    """Train `teacher` (built with the recipe's logit_scale) in place by `recipe` for `epochs`
    over `loader` (an EpochDataLoader or InMemoryBatches of (images (B, 3, H, W), labels
    (B,))), every process its share under DDP; returns the last epoch's mean training loss.
    Leaves it in eval mode, frozen, with rank 0's batch-norm statistics on every process."""
    prepare(teacher, recipe)
    model = process_group.distributed(teacher, info, device)
    peak = peak_lr(recipe, batch_size=loader.batch_size, info=info)
    groups = [g for g in param_groups(teacher, recipe, peak) if g["params"]]
    optimizer = torch.optim.SGD(groups, lr=peak, momentum=recipe.momentum, nesterov=True)
    total = epochs * len(loader)
    lookahead_from = None if recipe.lookahead_start is None else recipe.lookahead_start * total
    lookahead = None
    step = 0
    teacher.train()
    loss_sum = torch.zeros((), device=device)
    for epoch in range(epochs):
        began = time.perf_counter()
        loader.set_epoch(epoch)
        loss_sum.zero_()
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            factor = lr_factor(recipe, step, total)
            for group in optimizer.param_groups:
                stopped = group.get("stem_bias") and step >= recipe.stem_bias_steps * total
                group["lr"] = 0.0 if stopped else group["peak"] * factor
            with autocast(device, amp, amp_dtype):
                logits = model(images)  # (B, K)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=recipe.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            loss_sum += loss.detach()
            if lookahead_from is not None and step >= lookahead_from:
                if step % LOOKAHEAD_EVERY == 0:
                    if lookahead is None:
                        lookahead = Lookahead(teacher)
                    else:
                        rho = LOOKAHEAD_BASE**LOOKAHEAD_EVERY * (step / total) ** LOOKAHEAD_POW
                        lookahead.pull(rho)
        if lookahead is not None:  # each epoch ends on the average
            lookahead.pull(1.0)
        if info.is_main:
            logger.info(
                "teacher epoch %d/%d: train loss %.4f, %.1f s",
                epoch + 1,
                epochs,
                loss_sum.item() / len(loader),
                time.perf_counter() - began,
            )
    if info.enabled:  # each process's norms saw its own share of the images: take rank 0's
        for buffer in teacher.buffers():
            torch.distributed.broadcast(buffer, src=0)
    freeze(teacher)
    return loss_sum.item() / max(1, len(loader))


def freeze(teacher: CnnTeacher) -> CnnTeacher:
    """Eval mode (batch norm from its running statistics) and no gradients: a teacher."""
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher
