"""TriAxialKV's calibration measure (arXiv 2605.17170): how much attention output a tag's tokens cost
when stored at each precision, every other token exact."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference.equations.attention import attention_ref
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig


def tag_distortion(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    token_tags: Sequence[object],
    table: Sequence[object],
    config: TokenPrecisionConfig | None = None,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """D[i, j] for one layer and one request: tag table[i] stored at config.precisions[j] and every
    other token exact, the attention-output MSE of the worst query head (mean over the prefill's
    positions and channels; causal float32 attention).

    The tag's tokens are stored as the cache stores them when every token of the request has that
    precision (so the low keys' groups of G run over the request's tokens in order, and role-aware
    PN-Mix chooses its pairs from the whole prompt). q: [H, T, d]; k, v: [H_kv, T, d] (after RoPE);
    token_tags: [T]. A tag absent from the request gets NaN (the caller averages over the requests
    that hold it).
    """
    config = TokenPrecisionConfig() if config is None else config
    if len(token_tags) != k.shape[1]:
        raise ValueError(f"token_tags must have one tag per token ({k.shape[1]}), got {len(token_tags)}")
    q, k, v = q[None].float(), k[None].float(), v[None].float()
    exact = attention_ref(q, k, v, scale=scale, causal=True)[0]
    out = torch.full((len(table), len(config.precisions)), float("nan"), dtype=torch.float64)
    for j, bits in enumerate(config.precisions):
        cache = TokenPrecisionCache(config)
        cache.prefill(q, k, v, torch.full((k.shape[2],), bits))
        k_all, v_all = cache.dequantize()
        for i, tag in enumerate(table):
            idx = torch.tensor([t == tag for t in token_tags]).nonzero().flatten()
            if not len(idx):
                continue
            k_hat, v_hat = k.clone(), v.clone()
            k_hat[..., idx, :], v_hat[..., idx, :] = k_all[..., idx, :], v_all[..., idx, :]
            approx = attention_ref(q, k_hat, v_hat, scale=scale, causal=True)[0]
            out[i, j] = float(((approx - exact) ** 2).mean(dim=(1, 2)).max())
    return out


__all__ = ["tag_distortion"]
