"""ModelEma (--model-ema): its warm-up of the decay and the step it takes toward the weights.
That it follows training on the device is tests/test_gpu.py's
test_ema_lives_on_the_device_and_averages_each_step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit.training.ema import ModelEma


def test_the_decay_warms_up_as_one_plus_step_over_ten_plus_step_capped_at_the_decay():
    ema = ModelEma(nn.Linear(2, 2), decay=0.5)
    # update 1: 2/11, update 2: 3/12, ..., 8/17; 9/18 = 0.5 from update 8 on: the cap
    assert [ema.next_decay() for _ in range(9)] == pytest.approx(
        [2 / 11, 3 / 12, 4 / 13, 5 / 14, 6 / 15, 7 / 16, 8 / 17, 0.5, 0.5]
    )
    assert ema.updates == 9


def test_an_update_moves_the_average_toward_the_weights_by_one_minus_the_decay():
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = ModelEma(model, decay=0.99)
    with torch.no_grad():
        model.weight.fill_(11.0)
    ema.update(model)  # decay 2/11: the average 0 + (1 - 2/11) * (11 - 0) = 9
    assert ema.module.weight.item() == pytest.approx(9.0)
    assert ema.updates == 1
