"""The accepted values of a number (`Range`), the ranges settings share, and the one-line
complaint about a value outside its range. Light on purpose (math only): `--help` reads them."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The accepted values of a number: low <= value <= high, either end maybe open or absent.
    Floats must also be finite."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is not accepted
    high_open: bool = False  # high itself is not accepted
    integer: bool = False

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (
            self.high is not None and (value > self.high or (self.high_open and value == self.high))
        )

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high is None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{kind} in {left}{self.low:g}, {self.high:g}{right}"


AT_LEAST_1 = Range(1, integer=True)
AT_LEAST_0 = Range(0, integer=True)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
PROBABILITY = Range(0, 1)  # a chance per image or batch: 0 never, 1 always
DROP_RATE = Range(0, 1, high_open=True)  # a fraction dropped: 1 would drop everything


def out_of_range(flag: str, value: float, accepted: Range, what: str = "") -> str:
    """'--epochs 0: training epochs; accepted: an integer >= 1'."""
    return f"{flag} {value}: {what + '; ' if what else ''}accepted: {accepted}"
