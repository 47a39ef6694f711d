"""Statistics of task accuracy: Wilson intervals, and the exact McNemar test of two methods scored on
the same items (scipy's exact binomial test; no normal approximation at these item counts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Accuracy:
    correct: int
    n: int
    low: float  # 95% Wilson interval
    high: float

    @property
    def value(self) -> float:
        return self.correct / self.n


def accuracy(outcomes: Sequence[bool], confidence: float = 0.95) -> Accuracy:
    """Share of items answered right, with its Wilson score interval."""
    from scipy.stats import binomtest

    n = len(outcomes)
    if n == 0:
        raise ValueError("outcomes must hold at least one item, got none")
    k = sum(bool(o) for o in outcomes)
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Accuracy(k, n, ci.low, ci.high)


@dataclass(frozen=True)
class Paired:
    difference: float  # accuracy of the method minus the baseline's, same items
    method_only: int  # items only the method got right
    baseline_only: int  # items only the baseline got right
    p_value: float  # exact McNemar (two-sided binomial test on the discordant items); 1.0 when none


def paired(method: Sequence[bool], baseline: Sequence[bool]) -> Paired:
    """How a method's answers differ from the baseline's on the same items."""
    from scipy.stats import binomtest

    if len(method) != len(baseline) or not method:
        raise ValueError(f"method and baseline must score the same items, got {len(method)} and {len(baseline)}")
    b = sum(m and not f for m, f in zip(method, baseline, strict=True))
    c = sum(f and not m for m, f in zip(method, baseline, strict=True))
    p = binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    return Paired((b - c) / len(method), b, c, float(p))


def items_to_resolve(difference: float = 0.05, accuracy: float = 0.8, discordant: float | None = None) -> int:
    """Items needed for an exact McNemar test at 5% to resolve `difference` with 80% power, by the usual
    normal approximation (Connor 1987), given the share of discordant items (by default the smallest a
    difference of that size allows plus the disagreements two methods near `accuracy` make)."""
    z_a, z_b = 1.959964, 0.841621
    psi = discordant if discordant is not None else difference + 2 * accuracy * (1 - accuracy) * 0.25
    if not 0 < difference <= psi <= 1:
        raise ValueError(f"need 0 < difference <= discordant share <= 1, got {difference} and {psi}")
    n = (z_a * math.sqrt(psi) + z_b * math.sqrt(psi - difference**2)) ** 2 / difference**2
    return math.ceil(n)
