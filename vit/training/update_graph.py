"""The update half of a training step as one CUDA graph (`--graph-update`): gradient clipping,
the optimizer's step (AdamW, or Muon and AdamW) and the EMA, captured once and replayed.

Eager, that half of the GPU speedrun's step launches hundreds of kernels, and their host time
alone was ~4.5-5 ms a step on a Xeon core (benchmarks/host_overhead.py: Muon's step ~3 ms,
clipping and the EMA ~0.6 each), a third of the whole step of the recipe's 4M-parameter model
on an H200 (13.9 ms). Replayed as a CUDA graph, it is one launch. Captured, not compiled:
torch.compile of the same function took 83 s to compile on that CPU from a cold cache, mostly
in inductor's search for fusions over ~100 tensors' operations (`host_overhead.py
--compile-seconds`), time a five-minute run would pay on every bare machine; a capture
compiles nothing.

The arithmetic is the eager update's, on the optimizer's and the EMA's own tensors (momentum
buffers, AdamW's moments and step counts, the EMA's weights): a checkpoint written by one
resumes under the other, and the two agree to float rounding (tests/test_gpu.py). What changes
from step to step (learning rates, Adam's bias corrections, the EMA's decay) is computed on the
host in float64, as the eager optimizers compute it, and copied into the graph's tensor of
scalars; the gradients are copied into the graph's own (one multi-tensor copy). On a CPU, which
has no launches to save, the same arithmetic runs as it is. Not supported: float16's gradient
scaler (train in bfloat16), a parameter left without a gradient, and, under
DistributedDataParallel, Muon's sharing of Newton-Schulz between the processes (each process
orthogonalises every matrix: the same updates, more work).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from ..utils.messages import one_line
from .ema import ModelEma, paired_tensors
from .optimizers import (
    Muon,
    adamw_moments_,
    adamw_states,
    momentum_buffers,
    nesterov_momentum,
    orthogonalize_all,
    update_scale,
)

logger = logging.getLogger("vit")
T = TypeVar("T")


@dataclass(frozen=True)
class GroupPlan:
    """One optimizer group, as the update sees it: what stays fixed for a run."""

    muon: bool  # Muon's orthogonalised momentum; else AdamW
    size: int  # the group's tensors
    splits: int  # Muon: blocks of rows orthogonalised each alone (3 for a fused qkv weight)
    momentum: float  # Muon's
    betas: tuple[float, float]  # AdamW's
    eps: float  # AdamW's
    scales: tuple[float, ...]  # Muon: each tensor's update scale, 0.2 sqrt(max(m, n)) of a block


class UpdateGraph:
    """Call it after `loss.backward()`: clips the gradients to `clip_grad` (None: no
    clipping), steps `optimizer` (Muon, or torch's AdamW), updates `ema` (None: no EMA). On a
    GPU the first call captures the three as one CUDA graph, and every call replays it (where
    CUDA refuses the capture: one warning, that call's update runs uncaptured, and
    `capturable` turns False, which tells the training loop to take the eager update from
    then on: on the H200, 28,635 images/s against 18,699 with this function uncaptured). Each
    call reads the groups' learning rates, so the scheduler drives it as it drives the eager
    step. Build it after any `optimizer.load_state_dict`: it holds the state's tensors (and
    creates the missing ones, as the eager step's first call would)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        ema: ModelEma | None,
        clip_grad: float | None,
    ) -> None:
        if not isinstance(optimizer, Muon | torch.optim.AdamW):
            raise TypeError(f"--graph-update: {type(optimizer).__name__} is not Muon or AdamW")
        self.optimizer, self.model, self.ema = optimizer, model, ema
        self.max_norm = clip_grad or None
        self.groups = [group for group in optimizer.param_groups if group["params"]]
        self.plans = [plan_group(group) for group in self.groups]
        self.state = [group_state(optimizer, group) for group in self.groups]
        self.params = [param for group in self.groups for param in group["params"]]
        # the EMA's (average, model) tensors: the floating ones averaged, the others copied
        self.ema_pairs, self.ema_copies = paired_tensors(ema.module, model) if ema else ([], [])
        self.graph: torch.cuda.CUDAGraph | None = None  # captured by the first call on a GPU
        self.capturable = True  # until a capture fails; then the caller steps eagerly
        self.static_grads: list[torch.Tensor] = []  # what the graph reads its inputs from
        self.static_scalars: torch.Tensor | None = None

    def __call__(self) -> None:
        grads = self.gradients()
        scalars = torch.tensor(self.scalars(), dtype=torch.float32)  # (S,)
        if self.params[0].is_cuda and self.graph is None and self.capturable:
            self.capture_or_warn(grads, scalars)
        if self.graph is None:  # a CPU, or a GPU where the capture failed: the same arithmetic
            self.apply(grads, scalars.to(self.params[0].device))
        else:
            torch._foreach_copy_(self.static_grads, grads)
            # from pinned memory: the copy is queued, and the host goes on
            self.static_scalars.copy_(scalars.pin_memory(), non_blocking=True)
            self.graph.replay()
        self.finish()

    def gradients(self) -> list[torch.Tensor]:
        """The parameters' gradients; RuntimeError naming those without one (the update steps
        every trained parameter), before anything moves."""
        grads = [param.grad for param in self.params]
        if any(grad is None for grad in grads):
            named = self.model.named_parameters()
            names = [name for name, p in named if p.requires_grad and p.grad is None]
            raise RuntimeError(
                f"--graph-update: {', '.join(names[:3])} got no gradient this step, and the "
                f"update steps every trained parameter; train without --graph-update or "
                f"--graph-step"
            )
        return grads

    def finish(self) -> None:
        """What follows each update outside its graph: the EMA's copies of the tensors it does
        not average, and the mark torch's learning-rate schedulers check (their wrapper of
        optimizer.step sets it) before warning that the schedule stepped before the optimizer."""
        self.optimizer._opt_called = True
        for average, now in self.ema_copies:
            average.copy_(now)

    def capture_or_warn(self, grads: list[torch.Tensor], scalars: torch.Tensor) -> None:
        """`capture`; where CUDA refuses it, one warning, and the update runs uncaptured (the
        same steps, launched one by one): a run is not lost to it."""
        started = time.perf_counter()
        try:
            self.capture(grads, scalars)
            seconds = time.perf_counter() - started
            logger.info("--graph-update: the update captured as one CUDA graph in %.2f s", seconds)
        except RuntimeError as error:
            self.capturable = False
            logger.warning(
                "--graph-update: the update could not be captured as a CUDA graph (%s); the "
                "eager update takes the same steps, kernel by kernel",
                one_line(error),
            )

    def capture(self, grads: list[torch.Tensor], scalars: torch.Tensor) -> None:
        """Record `apply` on the graph's own input tensors (made here: copies of `grads` and
        of `scalars`, (S,) on the CPU) as one CUDA graph (`captured_after_warm_up`)."""
        self.static_grads = [grad.clone() for grad in grads]
        self.static_scalars = scalars.to(grads[0].device)
        self.graph, _ = captured_after_warm_up(
            lambda: self.apply(self.static_grads, self.static_scalars),
            updated=self.updated_tensors(),
            # another thread's CUDA calls (a loader's, say) do not break the capture
            capture_error_mode="thread_local",
        )

    def updated_tensors(self) -> list[torch.Tensor]:
        """Every tensor `apply` updates: the parameters, the EMA's weights, the optimizer's
        state."""
        updated = [*self.params, *(average for average, _ in self.ema_pairs)]
        updated += [t for state in self.state for key in TENSOR_LISTS for t in state.get(key, [])]
        return updated

    def scalars(self) -> list[float]:
        """This step's numbers, in float64 as the eager optimizers compute them: per group
        1 - lr * weight decay, then Muon's -lr * scale per tensor, or AdamW's
        -lr / (1 - beta1^t) and 1 - beta2^t; last, the EMA's 1 - decay."""
        values = []
        for group, plan, state in zip(self.groups, self.plans, self.state, strict=True):
            lr = group["lr"]
            values.append(1 - lr * group["weight_decay"])
            if plan.muon:
                values += [-lr * scale for scale in plan.scales]
            else:
                torch._foreach_add_(state["steps"], 1)  # the saved counts, as the eager step
                state["step"] += 1
                beta1, beta2 = plan.betas
                values += [-lr / (1 - beta1 ** state["step"]), 1 - beta2 ** state["step"]]
        if self.ema is not None:
            values.append(1 - self.ema.next_decay())
        return values

    @torch.no_grad()
    def apply(self, grads: list[torch.Tensor], scalars: torch.Tensor) -> None:
        """The update, from the gradients and `scalars` (on the parameters' device); the
        parameters, the optimizer's state and the EMA updated in place. No host reads: it can
        be captured."""
        if self.max_norm is not None:
            grads = clip_by_total_norm(grads, self.max_norm)
        first, at = 0, 0  # the group's first tensor, its first scalar
        blocks, targets = [], []  # Muon's blocks to orthogonalise; (param, -lr * scale, splits)
        for plan, state in zip(self.plans, self.state, strict=True):
            params = self.params[first : first + plan.size]
            group_grads = grads[first : first + plan.size]
            first += plan.size
            torch._foreach_mul_(params, scalars[at])  # decoupled weight decay
            if plan.muon:
                nesterov = nesterov_momentum(group_grads, state["buffers"], plan.momentum)
                for i, (param, update) in enumerate(zip(params, nesterov, strict=True)):
                    blocks += update.reshape(plan.splits, -1, update.shape[-1]).unbind(0)
                    targets.append((param, scalars[at + 1 + i], plan.splits))
                at += 1 + plan.size
            else:
                adamw_(params, group_grads, state, plan, scalars[at + 1], scalars[at + 2])
                at += 3
        if blocks:  # Muon's groups
            steps, dtype = self.optimizer.ns_steps, self.optimizer.ns_dtype
            orthogonal = iter(orthogonalize_all(blocks, steps, dtype))
        for param, step, splits in targets:
            update = torch.stack([next(orthogonal) for _ in range(splits)])  # (splits, m, n)
            param.add_(update.reshape(param.shape) * step)
        if self.ema is not None:  # average += (1 - decay) (model - average), as lerp
            averaged = [average for average, _ in self.ema_pairs]
            moves = torch._foreach_sub([now for _, now in self.ema_pairs], averaged)
            torch._foreach_mul_(moves, scalars[at])
            torch._foreach_add_(averaged, moves)


TENSOR_LISTS = ("buffers", "exp_avgs", "exp_avg_sqs")


@contextlib.contextmanager
def undone(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Whatever the block does to `tensors` in place, undone at its end, bit for bit, whether
    or not it ran to its end: the warm-up a capture runs first (a step taken, not to be kept)."""
    saved = [tensor.clone() for tensor in tensors]
    try:
        yield
    finally:
        # no_grad: the parameters are leaves that require grad, and autograd refuses an
        # in-place copy into them outside it (what failed the first capture on an H200)
        with torch.no_grad():
            torch._foreach_copy_(tensors, saved)


def captured_after_warm_up(
    record: Callable[[], T], updated: list[torch.Tensor], capture_error_mode: str
) -> tuple[torch.cuda.CUDAGraph, T]:
    """`record()` captured as one CUDA graph: (the graph, what the captured call returned:
    tensors every replay overwrites). One warm-up call first, on a side stream as CUDA graphs
    require, so that lazy initialisation, the kernels' tuning and any compilation happen
    outside the capture (compiling inside one fails: dynamo reads the CUDA generator's state,
    which a capture refuses, pytorch/pytorch#131782); what it did to `updated` (in place) and
    its random draws then undone. The capture itself updates nothing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with (
            torch.cuda.stream(side),
            torch.random.fork_rng(devices=[updated[0].device], device_type="cuda"),
            undone(updated),
        ):
            record()
    finally:
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=capture_error_mode):
        outputs = record()
    return graph, outputs


def plan_group(group: dict) -> GroupPlan:
    muon = group.get("use_muon", False)
    if group.get("amsgrad") or group.get("maximize"):
        raise ValueError("--graph-update: AdamW's amsgrad and maximize are not supported")
    splits = group.get("splits", 1)
    # each tensor's (splits * m, n) weight is updated as splits blocks of (m, n)
    scales = [update_scale(p.shape[0] // splits, p.shape[1]) for p in group["params"] if muon]
    return GroupPlan(
        muon=muon,
        size=len(group["params"]),
        splits=splits,
        momentum=group.get("momentum", 0.0),
        betas=tuple(group["betas"]),
        eps=group["eps"],
        scales=tuple(scales),
    )


def group_state(optimizer: torch.optim.Optimizer, group: dict) -> dict:
    """The group's state tensors as lists (made as the eager step makes them on its first
    call where missing), and an AdamW group's step count."""
    params = group["params"]
    if group.get("use_muon", False):
        return {"buffers": momentum_buffers(optimizer.state, params)}
    # Muon keeps AdamW's counts in float64, torch's AdamW in float32 (both on the CPU)
    count_dtype = torch.float64 if isinstance(optimizer, Muon) else torch.float32
    states = adamw_states(optimizer.state, params, count_dtype)
    counts = {int(state["step"].item()) for state in states}
    if len(counts) > 1:
        raise ValueError(
            f"--graph-update: one AdamW group's tensors took different numbers of steps "
            f"({sorted(counts)}), which its bias correction cannot follow; resume without it"
        )
    return {
        "exp_avgs": [state["exp_avg"] for state in states],
        "exp_avg_sqs": [state["exp_avg_sq"] for state in states],
        "steps": [state["step"] for state in states],
        "step": counts.pop(),
    }


def clip_by_total_norm(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """`grads` scaled as nn.utils.clip_grad_norm_ scales them: by max_norm / their total
    norm, where that is below 1."""
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return torch._foreach_mul(grads, coefficient)


def adamw_(params, grads, state: dict, plan: GroupPlan, step_size, bias_correction2) -> None:
    """AdamW's moments and step (Loshchilov & Hutter) in place, as Muon's eager AdamW; the
    weight decay is applied before. `step_size`: -lr / (1 - beta1^t)."""
    adamw_moments_(state["exp_avgs"], state["exp_avg_sqs"], grads, plan.betas)
    denoms = torch._foreach_div(state["exp_avg_sqs"], bias_correction2)
    torch._foreach_sqrt_(denoms)
    torch._foreach_add_(denoms, plan.eps)
    steps = torch._foreach_div(state["exp_avgs"], denoms)
    torch._foreach_mul_(steps, step_size)
    torch._foreach_add_(params, steps)
