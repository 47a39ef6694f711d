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


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test (ties dropped): the p of `wins` against `losses` under no preference; on the
    discordant items of two methods it is the exact McNemar test. 1.0 where there is nothing to compare."""
    from scipy.stats import binomtest

    return float(binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0


def resolvable_share(units: int, alpha: float = 0.05, power: float = 0.80) -> tuple[int, float] | None:
    """What `units` paired units (prompts, conversations) resolve by the two-sided sign test at `alpha`: (the fewest
    of them one side must win for p < alpha, the share of units a side must win in truth for `power` to show it);
    None where no count can."""
    from scipy.stats import binom

    need = next((k for k in range(units // 2 + 1, units + 1) if sign_test(k, units - k) < alpha), None)
    if need is None:
        return None
    share = next(x / 1000 for x in range(500, 1001) if binom.sf(need - 1, units, x / 1000) >= power)
    return need, share


def resolution(units: int, noun: str, alpha: float = 0.05) -> str:
    """What `units` paired units (named `noun`) decide and resolve by the sign test (`resolvable_share`), as an
    undecided verdict says it."""
    r = resolvable_share(units, alpha)
    if r is None:
        return f"; {units} {noun} cannot reach p < {alpha:g} in a sign test whatever they show"
    return (
        f"; {units} {noun} decide where one side wins on {r[0]} or more, and resolve a side that wins on "
        f"{r[1]:.0%} of {noun} at 80% power"
    )


def paired(method: Sequence[bool], baseline: Sequence[bool]) -> Paired:
    """How a method's answers differ from the baseline's on the same items."""

    if len(method) != len(baseline) or not method:
        raise ValueError(f"method and baseline must score the same items, got {len(method)} and {len(baseline)}")
    b = sum(m and not f for m, f in zip(method, baseline, strict=True))
    c = sum(f and not m for m, f in zip(method, baseline, strict=True))
    return Paired((b - c) / len(method), b, c, sign_test(b, c))


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


def detectable(n: int, discordant: float, power: float = 0.80, alpha: float = 0.05) -> float:
    """The smallest paired difference `n` items resolve with `power` at two-sided `alpha`, given the share of
    discordant items (Connor 1987's sample size for McNemar's test, solved for the difference): what a sample
    can tell, not the half-width of the interval it happened to give. A difference d needs a share of at least d
    discordant items, so the share used is the larger of the two; 1.0 when the items cannot resolve any
    difference."""
    from scipy.stats import norm

    if n < 1 or not 0 <= discordant <= 1:
        raise ValueError(f"need n >= 1 and a discordant share in [0, 1], got {n} and {discordant}")
    z_a, z_b = norm.ppf(1 - alpha / 2), norm.ppf(power)

    def needed(d: float) -> float:
        psi = max(discordant, d)  # a difference d needs at least a share d of discordant items
        return (z_a * math.sqrt(psi) + z_b * math.sqrt(max(psi - d * d, 0.0))) ** 2 / (d * d)

    if needed(1.0) > n:
        return 1.0
    low, high = 1e-9, 1.0  # needed() falls as d grows: bisect for needed(d) = n
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if needed(mid) > n else (low, mid)
    return high


def discordant_share(method: Sequence[bool], baseline: Sequence[bool]) -> float:
    """The share of items on which the two disagree (one right, the other wrong)."""
    return sum(bool(m) != bool(f) for m, f in zip(method, baseline, strict=True)) / len(method)


@dataclass(frozen=True)
class Margin:
    """The one rule for "close to" and "differs by": the 90% interval of a paired difference (two one-sided
    tests at 5%) against a margin symmetric about no difference (`margin_rule`)."""

    status: str  # "within", "outside", "excludes the reference gap", "undecided"
    low: float
    high: float
    detectable: float  # what the items resolve at 80% power (`detectable`)

    @property
    def decided(self) -> bool:
        return self.status != "undecided"


def margin_rule(
    method: Sequence[bool], baseline: Sequence[bool], margin: float, gap: tuple[float, float] | None = None
) -> Margin:
    """Within when the 90% interval of accuracy(method) - accuracy(baseline) lies inside (-margin, margin);
    outside when it lies wholly beyond one side; "excludes the reference gap" when neither but it excludes the
    range `gap` (a difference the source reports, e.g. the paper's own); undecided otherwise."""
    if margin <= 0:
        raise ValueError(f"margin must be positive, got {margin}")
    lo, hi = paired_interval(method, baseline, 0.90)
    resolved = detectable(len(method), discordant_share(method, baseline))
    if -margin < lo and hi < margin:
        status = "within"
    elif hi <= -margin or lo >= margin:
        status = "outside"
    elif gap is not None and (hi < min(gap) or lo > max(gap)):
        status = "excludes the reference gap"
    else:
        status = "undecided"
    return Margin(status, lo, hi, resolved)


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
