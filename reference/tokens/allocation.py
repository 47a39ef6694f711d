"""Bits per token tag under an average-bit budget (TriAxialKV, arXiv 2605.17170, its allocator).

Each tag k (`reference.tokens.roles`) holds n_k tokens and can be stored at one of M precisions
(TriAxialKV: INT2 or INT4), precision m costing c_km bits per element (payload, scales, zeros:
what `reference.channels.storage` counts) and distorting attention by D_k(m) (its calibration:
attention-output MSE, max over heads, mean over requests, summed over layers). The allocator
chooses m_k for every tag to

    minimize  sum_k D_k(m_k)   subject to   sum_k n_k c_k(m_k) / sum_k n_k <= budget,

by exhaustive search while there are at most 2^22 assignments (22 tags at two precisions, the
paper's bound), else greedily: from the cheapest precision everywhere, repeatedly raise the tag
whose next precision removes the most distortion per added bit and still fits the budget.
Distortions are assumed additive over tags, as the paper's allocator assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reference.tokens.config import TokenPrecisionConfig

#: The most assignments the exhaustive search enumerates (22 tags at two precisions).
EXHAUSTIVE_LIMIT = 1 << 22
_CHUNK = 1 << 16
_TIE = 1e-12  # relative: distortion sums that differ by rounding alone are equal


@dataclass(frozen=True)
class Allocation:
    """The precision index chosen for each tag, and what it costs and distorts."""

    choice: tuple[int, ...]
    average_bits: float
    distortion: float
    search: str  # "exhaustive" or "greedy"


def _check(distortion: torch.Tensor, tokens: torch.Tensor, costs: torch.Tensor, budget: float) -> None:
    if distortion.dim() != 2 or distortion.shape[1] < 1:
        raise ValueError(f"distortion must be [tags, precisions], got shape {tuple(distortion.shape)}")
    k, m = distortion.shape
    if tokens.shape != (k,):
        raise ValueError(f"tokens must be [{k}] (one count per tag), got shape {tuple(tokens.shape)}")
    if costs.shape != (k, m):
        raise ValueError(
            f"costs must be [{m}] or [{k}, {m}] (bits per element of each precision), got shape {tuple(costs.shape)}"
        )
    for name, t in (("distortion", distortion), ("tokens", tokens), ("costs", costs)):
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError(f"{name} must be finite and >= 0")
    if float(tokens.sum()) <= 0:
        raise ValueError("tokens must count at least one token")
    if not bool((costs[:, 1:] >= costs[:, :-1]).all()):
        raise ValueError("costs must not decrease from one precision to the next (cheapest first)")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive finite number of bits per element, got {budget!r}")


def _pick(table: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """table[k, choice[..., k]]: each tag's entry at its chosen precision, for assignments [..., K]."""
    return table.T.gather(0, choice.reshape(-1, table.shape[0])).reshape(choice.shape)


def _average(tokens: torch.Tensor, costs: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """Average bits per element of assignments choice [..., K]."""
    return (_pick(costs, choice) * tokens).sum(-1) / tokens.sum()


def _exhaustive(distortion: torch.Tensor, tokens: torch.Tensor, costs: torch.Tensor, budget: float):
    k, m = distortion.shape
    place = m ** torch.arange(k, dtype=torch.int64)
    best = None  # (distortion, bits, index)
    for first in range(0, m**k, _CHUNK):
        index = torch.arange(first, min(first + _CHUNK, m**k), dtype=torch.int64)
        choice = (index[:, None] // place) % m  # [n, K]: the precision of each tag
        bits = _average(tokens, costs, choice)
        total = _pick(distortion, choice).sum(-1)
        fits = bits <= budget * (1 + 1e-12)
        if not bool(fits.any()):
            continue
        total = torch.where(fits, total, math.inf)
        low = float(total.min())
        # the least distortion; of equals (up to rounding of the sums), the fewest bits, then the first
        tied = torch.nonzero(total <= low + _TIE * abs(low)).flatten()
        j = tied[torch.argmin(bits[tied])]
        cand = (low, float(bits[j]), int(index[j]))
        if (
            best is None
            or cand[0] < best[0] - _TIE * abs(best[0])
            or (cand[0] <= best[0] + _TIE * abs(best[0]) and cand[1] < best[1])
        ):
            best = cand
    return tuple(int(v) for v in (best[2] // place) % m)


def _greedy(distortion: torch.Tensor, tokens: torch.Tensor, costs: torch.Tensor, budget: float):
    k, m = distortion.shape
    choice = torch.zeros(k, dtype=torch.int64)
    spent = float(_average(tokens, costs, choice)) * float(tokens.sum())
    limit = budget * float(tokens.sum()) * (1 + 1e-12)
    while True:
        best, best_gain = None, 0.0
        for tag in range(k):
            c = int(choice[tag])
            if c == m - 1:
                continue
            extra = float(tokens[tag] * (costs[tag, c + 1] - costs[tag, c]))
            saved = float(distortion[tag, c] - distortion[tag, c + 1])
            if saved <= 0 or spent + extra > limit:
                continue  # no better, or does not fit
            gain = saved / extra if extra > 0 else math.inf
            if best is None or gain > best_gain:
                best, best_gain = tag, gain
        if best is None:
            return tuple(int(c) for c in choice)
        c = int(choice[best])
        spent += float(tokens[best] * (costs[best, c + 1] - costs[best, c]))
        choice[best] = c + 1


def allocate(
    distortion: torch.Tensor,
    tokens: torch.Tensor,
    costs: torch.Tensor,
    budget: float,
    *,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
) -> Allocation:
    """The precision of every tag that distorts least within `budget` average bits per element.

    distortion: [K, M] D_k(m); tokens: [K] token counts; costs: [M] or [K, M] bits per element
    of each precision, cheapest first; budget: average bits per element over all K tags' tokens.
    """
    distortion, tokens = torch.as_tensor(distortion, dtype=torch.float64), torch.as_tensor(tokens, dtype=torch.float64)
    costs = torch.as_tensor(costs, dtype=torch.float64)
    if costs.dim() == 1 and distortion.dim() == 2:
        costs = costs.expand(distortion.shape[0], -1)
    _check(distortion, tokens, costs, budget)
    cheapest = float(_average(tokens, costs, torch.zeros(len(tokens), dtype=torch.int64)))
    if cheapest > budget * (1 + 1e-12):
        raise ValueError(
            f"budget {budget} bits per element is below the cheapest allocation ({cheapest:.4f}: every tag at its "
            "lowest precision)"
        )
    k, m = distortion.shape
    exhaustive = m**k <= exhaustive_limit
    choice = (_exhaustive if exhaustive else _greedy)(distortion, tokens, costs, budget)
    index = torch.tensor(choice, dtype=torch.int64)
    return Allocation(
        choice,
        float(_average(tokens, costs, index)),
        float(_pick(distortion, index).sum()),
        "exhaustive" if exhaustive else "greedy",
    )


__all__ = ["EXHAUSTIVE_LIMIT", "Allocation", "allocate"]


def token_bits(tags, allocation: dict, config: TokenPrecisionConfig) -> torch.Tensor:
    """Each token's bits from its tag's allocation; a tag calibration never saw gets the high bits."""
    return torch.tensor([allocation.get(str(t), config.high_bits) for t in tags], dtype=torch.int64)
