"""The per-tag allocator: exhaustive search against brute force, the greedy beyond it, refusals."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.tokens.allocation import allocate


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


def brute_force(distortion, tokens, costs, budget):
    best = None
    for choice in itertools.product(range(len(distortion[0])), repeat=len(distortion)):
        bits = sum(tokens[k] * costs[k][c] for k, c in enumerate(choice)) / sum(tokens)
        if bits > budget * (1 + 1e-12):
            continue
        total = sum(distortion[k][c] for k, c in enumerate(choice))
        if best is None or (total, bits) < best[:2]:
            best = (total, bits, choice)
    return best


@st.composite
def problems(draw, max_tags=6, precisions=(2, 3)):
    k = draw(st.integers(1, max_tags))
    m = draw(st.sampled_from(precisions))
    finite = st.floats(0, 10, allow_nan=False)
    distortion = [sorted(draw(st.lists(finite, min_size=m, max_size=m)), reverse=True) for _ in range(k)]
    tokens = draw(st.lists(st.integers(1, 500), min_size=k, max_size=k))
    costs = sorted(draw(st.lists(st.floats(1, 8, allow_nan=False), min_size=m, max_size=m, unique=True)))
    budget = draw(st.floats(costs[0], costs[-1] + 0.5, allow_nan=False))
    return distortion, tokens, [costs] * k, budget


@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_the_exhaustive_search_finds_the_least_distortion_within_the_budget(problem):
    distortion, tokens, costs, budget = problem
    result = allocate(f64(distortion), f64(tokens), f64(costs), budget)
    total, bits, _ = brute_force(distortion, tokens, costs, budget)
    assert result.search == "exhaustive"
    assert result.average_bits <= budget * (1 + 1e-12)
    assert result.distortion == pytest.approx(total, abs=1e-9)
    assert result.average_bits <= bits + 1e-9  # of equal distortions, the fewest bits


@settings(max_examples=60, deadline=None)
@given(problem=problems(max_tags=8, precisions=(2,)))
def test_the_greedy_search_fits_the_budget_and_never_spends_bits_for_nothing(problem):
    distortion, tokens, costs, budget = problem
    greedy = allocate(f64(distortion), f64(tokens), f64(costs), budget, exhaustive_limit=1)
    best = allocate(f64(distortion), f64(tokens), f64(costs), budget)
    cheapest = sum(d[0] for d in distortion)
    assert greedy.search == "greedy"
    assert greedy.average_bits <= budget * (1 + 1e-12)
    assert best.distortion <= greedy.distortion + 1e-9 <= cheapest + 2e-9
    for k, c in enumerate(greedy.choice):  # a raised tag gained something for its bits
        assert c == 0 or distortion[k][c] < distortion[k][c - 1]


def test_the_greedy_search_raises_the_best_gain_per_bit_first():
    # Equal costs: tag 2 saves most per bit (9 over 100 tokens x 2 bits); the budget fits one tag at INT4.
    distortion = torch.tensor([[4.0, 1.0], [2.0, 1.5], [10.0, 1.0]])
    tokens = torch.tensor([100, 100, 100])
    result = allocate(distortion, tokens, torch.tensor([2.0, 4.0]), 2.7, exhaustive_limit=1)
    assert result.choice == (0, 0, 1)
    assert result.average_bits == pytest.approx(2 + 2 / 3)


def test_more_than_22_tags_at_two_precisions_go_greedy():
    k = 23
    result = allocate(torch.rand(k, 2).sort(descending=True).values, torch.ones(k), torch.tensor([2.0, 4.0]), 3.0)
    assert result.search == "greedy" and result.average_bits <= 3.0
    assert allocate(torch.ones(22, 2), torch.ones(22), torch.tensor([2.0, 4.0]), 3.0).search == "exhaustive"


def test_an_ample_budget_takes_the_best_precision_and_an_exact_one_is_met():
    distortion = torch.tensor([[3.0, 1.0], [5.0, 2.0]])
    assert allocate(distortion, torch.tensor([1, 3]), torch.tensor([2.0, 4.0]), 4.0).choice == (1, 1)
    exact = allocate(distortion, torch.tensor([1, 3]), torch.tensor([2.0, 4.0]), 3.5)  # (2 + 3 * 4) / 4
    assert exact.choice == (0, 1) and exact.average_bits == pytest.approx(3.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 1.5}, r"budget 1.5 bits per element is below the cheapest allocation \(2.0000"),
        ({"budget": float("nan")}, "budget must be a positive finite number"),
        ({"budget": 0}, "budget must be a positive finite number"),
        ({"tokens": torch.tensor([1.0])}, r"tokens must be \[2\]"),
        ({"costs": torch.tensor([4.0, 2.0])}, "costs must not decrease"),
        ({"distortion": torch.tensor([[1.0, float("nan")], [1.0, 0.5]])}, "distortion must be finite and >= 0"),
        ({"tokens": torch.tensor([0.0, 0.0])}, "at least one token"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, match):
    args = {
        "distortion": torch.tensor([[2.0, 1.0], [3.0, 1.0]]),
        "tokens": torch.tensor([5, 5]),
        "costs": torch.tensor([2.0, 4.0]),
        "budget": 3.0,
    } | kwargs
    with pytest.raises(ValueError, match=match):
        allocate(**args)
