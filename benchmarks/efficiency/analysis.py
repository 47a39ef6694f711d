"""Derived figures of the efficiency benchmarks, shared by the suites and the report.

Fig. 7's slope is a least-squares line through per-step latencies over steps 11K-31K (K = 1024,
so that 32K is the paper's 32768-token generation). Fig. 6c's sampled protocol times decode
steps at a few cache lengths and integrates the piecewise-linear step time over the whole
generation, instead of running every one of its 8K steps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from reference.paper import FIG7_FIT  # the paper's fit window, in decode steps

K = 1024


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys against xs; needs two distinct xs."""
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length, got {len(xs)} and {len(ys)}")
    if len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct x values, got {sorted(set(xs))}")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def latency_slope_us(steps: Sequence[int], step_ms: Sequence[float], window: tuple[int, int] = FIG7_FIT) -> float:
    """Fig. 7: microseconds of latency added per decode step, fitted over the steps in `window`."""
    inside = [(s, ms) for s, ms in zip(steps, step_ms, strict=True) if window[0] <= s <= window[1]]
    if len({s for s, _ in inside}) < 2:
        raise ValueError(f"need latencies at two or more steps within {window}, got steps {sorted(steps)}")
    slope_ms, _ = linear_fit([s for s, _ in inside], [ms for _, ms in inside])
    return slope_ms * 1e3


def integrated_decode_seconds(lengths: Sequence[int], step_ms: Sequence[float], start: int, stop: int) -> float:
    """Seconds to decode every step whose cache length t runs over [start, stop), from step times
    sampled at `lengths`: linear between samples, flat beyond the first and last (trapezoid rule
    on the integer grid, exact for a piecewise-linear step time)."""
    if not lengths or len(lengths) != len(step_ms):
        raise ValueError(f"need as many step times as lengths, got {len(step_ms)} and {len(lengths)}")
    if stop <= start:
        raise ValueError(f"stop ({stop}) must exceed start ({start})")
    pts = sorted(zip(lengths, step_ms, strict=True))
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    if len(set(xs)) != len(xs):
        raise ValueError(f"lengths must be distinct, got {sorted(lengths)}")

    def at(t: float) -> float:
        if t <= xs[0]:
            return ys[0]
        if t >= xs[-1]:
            return ys[-1]
        i = next(j for j in range(1, len(xs)) if xs[j] >= t)
        w = (t - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + w * (ys[i] - ys[i - 1])

    # Sum of at(t) for t = start..stop-1: integrate each linear piece exactly on its integers.
    knots = sorted({start, stop - 1, *(x for x in xs if start < x < stop - 1)})
    total = at(knots[0])
    for a, b in itertools.pairwise(knots):
        n = b - a  # integers in (a, b]
        total += n * (at(a) + at(b)) / 2 + (at(b) - at(a)) / 2
    return total / 1e3


def tokens_per_second(batch: int, generation: int, seconds: float) -> float:
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"seconds must be positive and finite, got {seconds!r}")
    return batch * generation / seconds
