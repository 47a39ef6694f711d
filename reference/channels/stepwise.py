"""Stepwise attention: what each of several tokens appended at once would have read had they been
appended one at a time (teacher forcing over chunks, `reference.ReferenceCache.attend_stepwise`),
computed from any channel-family cache's dequantized state and the layout rule alone, so that every
implementation's cache reads the same thing (`pnmix.PNMixCache.attend_stepwise` uses it too)."""

from __future__ import annotations

import torch

from reference.channels.config import PNMixConfig
from reference.channels.layout import token_layout
from reference.equations.attention import attention_logits_ref


def stepwise_attention(
    config: PNMixConfig,
    q: torch.Tensor,
    k_hat: torch.Tensor,
    v_hat: torch.Tensor,
    exact_keys: torch.Tensor,
    exact_values: torch.Tensor,
    *,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Query j of the newest T_new (position t = T - T_new + j) reads the tokens quantized at length
    t + 1 (`token_layout`) as the cache holds them (`k_hat`, `v_hat` [B, H_kv, T, d]: its dequantized
    keys and values, whose codes do not change once written) and the rest exact.

    exact_keys / exact_values: [B, H_kv, m, d], the exact keys / values of the newest m tokens,
    enough to reach back to the first position some query still sees exact (the residual before the
    chunk and the chunk itself do). Returns [B, H, T_new, d] in q's dtype."""
    b, h, t_all, d = k_hat.shape
    n = q.shape[2]
    bounds = [token_layout(config, t_all - n + j + 1) for j in range(n)]
    logits = attention_logits_ref(q, k_hat, scale=scale, causal=True)
    tail = []
    for exact, first_quantized in ((exact_keys, "n_quantized"), (exact_values, "n_value_quantized")):
        m = exact.shape[2]
        if exact.shape[:2] != (b, h) or exact.shape[3] != d or m > t_all:
            raise ValueError(f"exact keys and values must be [{b}, {h}, m <= {t_all}, {d}], got {tuple(exact.shape)}")
        # Columns of the newest m tokens that query j still sees exact: from its layout's residual on.
        start = torch.tensor([lay.n_sink + getattr(lay, first_quantized) for lay in bounds], device=q.device)
        columns = torch.arange(t_all - m, t_all, device=q.device)
        if int(start.min()) < t_all - m:
            raise ValueError(f"the exact tail of {m} tokens does not reach back to position {int(start.min())}")
        tail.append((exact, columns[None, :] >= start[:, None]))  # [T_new, m]
    (k_ex, use_k), (v_ex, use_v) = tail
    exact_logits = attention_logits_ref(q, k_ex.to(q.device), scale=scale)
    m_k = k_ex.shape[2]
    logits[..., t_all - m_k :] = torch.where(use_k, exact_logits, logits[..., t_all - m_k :])
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    causal = torch.ones(n, t_all, dtype=torch.bool, device=q.device).tril(diagonal=t_all - n)
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    rep = q.shape[1] // h
    m_v = v_ex.shape[2]
    from_exact = probs[..., t_all - m_v :] * use_v
    probs = torch.cat([probs[..., : t_all - m_v], probs[..., t_all - m_v :] - from_exact], dim=-1)
    out = probs @ v_hat.float().repeat_interleave(rep, dim=1) + from_exact @ v_ex.float().repeat_interleave(rep, dim=1)
    return out.to(q.dtype)
