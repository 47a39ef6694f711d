"""Derived figures: the Fig. 7 slope and the Fig. 6c integration, against direct computation."""

import pytest

from benchmarks.efficiency import analysis


def test_linear_fit_recovers_a_line():
    slope, intercept = analysis.linear_fit([1, 2, 3, 7], [5, 7, 9, 17])
    assert slope == pytest.approx(2) and intercept == pytest.approx(3)


def test_slope_uses_only_the_window():
    steps = [1024, 11264, 21504, 31744, 32752]
    ms = [45.0, 46.0, 48.0, 50.0, 99.0]  # outside points must not count
    assert analysis.latency_slope_us(steps, ms) == pytest.approx((50 - 46) / (31744 - 11264) * 1e3)
    with pytest.raises(ValueError, match="two or more steps"):
        analysis.latency_slope_us([1024, 11264], [1.0, 2.0])


@pytest.mark.parametrize(
    ("lengths", "ms", "start", "stop"),
    [([0, 10], [1.0, 11.0], 0, 11), ([3, 7], [2.0, 6.0], 0, 20), ([0, 5, 9], [1.0, 4.0, 2.0], 2, 13)],
)
def test_integration_equals_the_sum_of_interpolated_step_times(lengths, ms, start, stop):
    def at(t):
        if t <= lengths[0]:
            return ms[0]
        if t >= lengths[-1]:
            return ms[-1]
        i = next(j for j in range(len(lengths)) if lengths[j] >= t)
        return ms[i - 1] + (t - lengths[i - 1]) / (lengths[i] - lengths[i - 1]) * (ms[i] - ms[i - 1])

    expected = sum(at(t) for t in range(start, stop)) / 1e3
    assert analysis.integrated_decode_seconds(lengths, ms, start, stop) == pytest.approx(expected)


def test_tokens_per_second_and_bad_input():
    assert analysis.tokens_per_second(20, 8192, 2.0) == 81920
    with pytest.raises(ValueError, match="seconds must be positive"):
        analysis.tokens_per_second(1, 1, 0.0)
    with pytest.raises(ValueError, match="lengths must be distinct"):
        analysis.integrated_decode_seconds([1, 1], [1.0, 2.0], 0, 3)
