"""The exponential moving average of a model's weights (`--model-ema`)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, in an order that is the same for its deep copy."""
    return [*module.parameters(), *module.buffers()]


class ModelEma:
    """Exponential moving average of a model's weights (and a copy of its buffers).

    The decay warms up as (1 + step) / (10 + step), capped at `decay`, so that short runs
    are not dominated by the random initial weights (as timm's ModelEmaV3 with warmup).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        averaged, current = [], []
        for ema, now in zip(_tensors(self.module), _tensors(model), strict=True):
            if ema.dtype.is_floating_point:
                averaged.append(ema)
                current.append(now)
            else:
                ema.copy_(now)
        # all tensors in one call: a few kernels on a GPU instead of one launch per tensor
        # (the same per-tensor lerp on the CPU)
        torch._foreach_lerp_(averaged, current, 1.0 - decay)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])
