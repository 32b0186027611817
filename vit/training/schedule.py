"""The learning-rate schedule: linear warmup, then cosine decay, per optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier per optimizer step: linear warmup to 1, then cosine down to min_ratio."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor
