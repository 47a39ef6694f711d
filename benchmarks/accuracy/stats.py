"""Statistics of task accuracy: Wilson intervals, the exact McNemar test of two methods scored on the
same items (scipy's exact binomial test; no normal approximation at these item counts), and the
confidence interval of their paired difference (Newcombe's hybrid score interval), which decides
equivalence within a margin (two one-sided tests) and says what difference the items resolve."""

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


def paired_interval(method: Sequence[bool], baseline: Sequence[bool], confidence: float = 0.90) -> tuple[float, float]:
    """Confidence interval of accuracy(method) - accuracy(baseline) on the same items: Newcombe's hybrid
    score interval for paired proportions (Newcombe 1998, method 10: each accuracy's Wilson interval,
    combined with the continuity-corrected correlation phi of the two methods' outcomes). At 90% it is the two one-sided
    tests at 5%: equivalence within a margin holds when the interval lies inside it."""
    if len(method) != len(baseline) or not method:
        raise ValueError(f"method and baseline must score the same items, got {len(method)} and {len(baseline)}")
    n = len(method)
    both = sum(m and f for m, f in zip(method, baseline, strict=True))
    m_only = sum(m and not f for m, f in zip(method, baseline, strict=True))
    f_only = sum(f and not m for m, f in zip(method, baseline, strict=True))
    neither = n - both - m_only - f_only
    p1, p2 = (both + m_only) / n, (both + f_only) / n
    a1, a2 = accuracy(method, confidence), accuracy(baseline, confidence)
    margins = (both + m_only) * (f_only + neither) * (both + f_only) * (m_only + neither)
    # phi with Newcombe's continuity correction (else no discordant item gives a zero-width interval)
    agree = both * neither - m_only * f_only
    phi = (max(agree - n / 2, 0) if agree > 0 else agree) / math.sqrt(margins) if margins else 0.0
    low = (
        p1 - p2 - math.sqrt(max((p1 - a1.low) ** 2 - 2 * phi * (p1 - a1.low) * (a2.high - p2) + (a2.high - p2) ** 2, 0))
    )
    high = (
        p1 - p2 + math.sqrt(max((a1.high - p1) ** 2 - 2 * phi * (a1.high - p1) * (p2 - a2.low) + (p2 - a2.low) ** 2, 0))
    )
    return low, high


def resolves(interval: tuple[float, float]) -> float:
    """The margin these items can establish: the largest distance of the interval from no difference."""
    return max(abs(interval[0]), abs(interval[1]))
