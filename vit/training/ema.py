"""The exponential moving average of a model's weights (`--model-ema`)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, in an order that is the same for its deep copy."""
    return [*module.parameters(), *module.buffers()]


def paired_tensors(average: nn.Module, model: nn.Module) -> tuple[list, list]:
    """The (average's, model's) pairs of tensors: the floating-point ones, which are averaged,
    and the others (counters, indices), which are copied."""
    floating, other = [], []
    for pair in zip(_tensors(average), _tensors(model), strict=True):
        (floating if pair[0].dtype.is_floating_point else other).append(pair)
    return floating, other


class ModelEma:
    """Exponential moving average of a model's weights and floating-point buffers (its integer
    buffers, counters, copied).

    The decay warms up as (1 + step) / (10 + step), capped at `decay`, so that short runs
    are not dominated by the random initial weights (TensorFlow's ExponentialMovingAverage
    with num_updates; timm's ModelEmaV3 warms up by another curve, 1 - (1 + step)^(-2/3)).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0

    def next_decay(self) -> float:
        """Count one more update; its decay."""
        self.updates += 1
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = self.next_decay()
        floating, other = paired_tensors(self.module, model)
        for ema, now in other:
            ema.copy_(now)
        # all tensors in one call: a few kernels on a GPU instead of one launch per tensor
        # (the same per-tensor lerp on the CPU)
        averaged, current = [ema for ema, _ in floating], [now for _, now in floating]
        torch._foreach_lerp_(averaged, current, 1.0 - decay)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])
