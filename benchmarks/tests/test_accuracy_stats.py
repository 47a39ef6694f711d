"""Accuracy statistics against values worked by hand."""

import math

import pytest

from benchmarks.accuracy import stats as st


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval by its formula (Wilson 1927)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize(("k", "n"), [(8, 10), (0, 25), (25, 25), (57, 100)])
def test_the_interval_is_wilsons(k, n):
    a = st.accuracy([True] * k + [False] * (n - k))
    assert (a.correct, a.n) == (k, n) and a.value == k / n
    assert (a.low, a.high) == pytest.approx(wilson(k, n), abs=1e-6)
    assert a.low <= a.value <= a.high


def test_mcnemar_counts_only_the_items_the_two_disagree_on():
    method = [True] * 10 + [False] * 6 + [True] * 4
    fp16 = [True] * 10 + [True] * 6 + [False] * 4
    d = st.paired(method, fp16)
    assert (d.method_only, d.baseline_only) == (4, 6) and d.difference == pytest.approx(-2 / 20)
    # two-sided exact binomial over the 10 discordant items: P(X <= 4) + P(X >= 6), X ~ Bin(10, 1/2)
    tail = sum(math.comb(10, i) for i in range(5)) / 2**10
    assert d.p_value == pytest.approx(2 * tail)
    assert st.paired([True, False], [True, False]).p_value == 1.0
    assert st.paired([False] * 6, [True] * 6).p_value == pytest.approx(2 / 2**6)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="at least one item"):
        st.accuracy([])
    with pytest.raises(ValueError, match="the same items, got 2 and 3"):
        st.paired([True, False], [True, False, True])
    with pytest.raises(ValueError, match="difference <= discordant"):
        st.items_to_resolve(0.05, discordant=0.01)


def test_resolving_five_points_takes_hundreds_of_items():
    n = st.items_to_resolve(0.05, discordant=0.10)
    assert 250 < n < 400  # psi = 0.10, delta = 0.05: (1.96 * 0.316 + 0.84 * 0.308)^2 / 0.0025 ~ 310
    assert st.items_to_resolve(0.10, discordant=0.10) < n


def test_the_paired_interval_covers_the_true_difference_at_its_confidence():
    """Newcombe's interval by simulation: a method that flips each of the baseline's outcomes with some
    probability; over 300 draws the 95% interval holds the true difference at least 92% of the time."""
    import random

    from benchmarks.accuracy.stats import paired_interval

    rng = random.Random(2610)
    for n, p_base, flip in ((100, 0.8, 0.1), (350, 0.7, 0.15), (60, 0.9, 0.05)):
        true = p_base * (1 - flip) + (1 - p_base) * flip - p_base
        hits = 0
        for _ in range(300):
            base = [rng.random() < p_base for _ in range(n)]
            method = [b != (rng.random() < flip) for b in base]
            low, high = paired_interval(method, base, 0.95)
            hits += low <= true <= high
        assert hits / 300 >= 0.92, (n, p_base, flip, hits)


def test_the_paired_interval_narrows_with_items_and_is_never_empty():
    from benchmarks.accuracy.stats import paired_interval, resolves

    same = [True, False, True, True]
    widths = [resolves(paired_interval(same * k, same * k)) for k in (10, 100)]
    assert 0 < widths[1] < widths[0]  # identical answers: no difference, resolved more tightly with more items
    low, high = paired_interval([True] * 30 + [False] * 10, [True] * 40)
    assert low < -0.25 < high < 0  # ten of forty lost: the difference -0.25 inside, the interval below zero
    with pytest.raises(ValueError, match="same items"):
        paired_interval([True], [True, False])


@pytest.mark.parametrize(("n", "discordant"), [(40, 0.0), (100, 0.2), (350, 0.2), (1000, 0.05), (20_000, 0.01)])
def test_what_a_sample_resolves_is_the_difference_its_size_is_planned_for(n, discordant):
    """`detectable` inverts Connor's sample size: n items resolve d, and d needs no more than n items (a
    difference needs at least its own share of discordant items)."""
    from benchmarks.accuracy.stats import detectable, items_to_resolve

    d = detectable(n, discordant)
    assert 0 < d < 1
    assert items_to_resolve(d, discordant=max(discordant, d)) <= n + 1
    assert items_to_resolve(d * 0.9, discordant=max(discordant, d * 0.9)) > n
    assert detectable(4 * n, discordant) < d  # more items resolve less


def test_the_margin_rule_is_symmetric_about_no_difference():
    from benchmarks.accuracy.stats import margin_rule

    base = [True] * 900 + [False] * 100
    worse = [False] * 200 + [True] * 700 + [False] * 100  # -20 points
    better = [True] * 900 + [True] * 100  # +10 points
    close = [False] * 5 + [True] * 895 + [False] * 100  # -0.5 points
    assert margin_rule(worse, base, 0.05).status == "outside" == margin_rule(base, worse, 0.05).status
    assert margin_rule(better, base, 0.05).status == "outside"
    assert margin_rule(close, base, 0.05).status == "within" == margin_rule(base, close, 0.05).status
    m, mirrored = margin_rule(close, base, 0.05), margin_rule(base, close, 0.05)
    assert m.low == pytest.approx(-mirrored.high) and m.high == pytest.approx(-mirrored.low)


def test_the_margin_rule_is_undecided_where_the_interval_straddles_the_margin():
    from benchmarks.accuracy.stats import margin_rule

    base = [True] * 90 + [False] * 10
    method = [False] * 6 + [True] * 84 + [True] * 3 + [False] * 7  # -3 points on 100 items
    m = margin_rule(method, base, 0.05)
    assert m.status == "undecided" and m.low < -0.05 < m.high and not m.decided
    assert margin_rule(method, base, 0.05, gap=(-0.5, -0.4)).status == "excludes the reference gap"
    with pytest.raises(ValueError, match="margin must be positive"):
        margin_rule(method, base, 0)
