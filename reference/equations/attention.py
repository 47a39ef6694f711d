"""The attention oracle every attention comparison in the project uses."""

from __future__ import annotations

import math

import torch


def saturating_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype, finite values beyond dtype's largest finite value clamped to it (infinities and
    NaN kept). Attention over finite values is a convex combination of them, so it is finite; over
    a quantized cache the reconstructed values may pass the dtype's edge by the rounding of a stored
    scale (keys and values of 65504 reconstruct to 65536 with a float16 scale), and rounding that
    output to inf would turn finite inputs into an infinite output."""
    if not dtype.is_floating_point or torch.finfo(dtype).bits >= torch.finfo(x.dtype).bits:
        return x.to(dtype)
    big = torch.finfo(dtype).max
    return torch.where(x.isfinite(), x.clamp(-big, big), x).to(dtype)


def attention_logits_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    upcast: bool = True,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """The scaled scores q k^T of `attention_ref`, before the softmax, with its GQA, causal and window rules.

    q: [B, H, T_q, d]; k: [B, H_kv, T_k, d]. Returns [B, H, T_q, T_k] in float32 (upcast=True)
    or q's dtype. softcap: scores become softcap * tanh(scores / softcap) (Gemma 2's attention
    logit softcapping). With causal=True the keys a query may not see are -inf, so
    `torch.log_softmax(logits, -1)` gives exactly the log attention probabilities of `attention_ref`.
    window (with causal=True): a query sees only the last `window` positions up to its own (a
    sliding-window layer's attention).
    """
    if window is not None and (not causal or window < 1):
        raise ValueError(f"window must be a positive token count with causal=True, got {window} (causal={causal})")
    n_rep = q.shape[1] // k.shape[1]
    dtype = torch.float32 if upcast else q.dtype
    qc, kc = q.to(dtype), k.to(dtype).repeat_interleave(n_rep, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = torch.matmul(qc, kc.transpose(-1, -2)) * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if causal:
        t_q, t_k = q.shape[2], k.shape[2]
        allowed = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(diagonal=t_k - t_q)
        if window is not None:
            allowed &= ~torch.ones_like(allowed).tril(diagonal=t_k - t_q - window)
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    upcast: bool = True,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Plain softmax attention with GQA.

    q: [B, H, T_q, d]; k, v: [B, H_kv, T_k, d] with H a multiple of H_kv. Query head h
    reads KV head h // (H / H_kv). scale defaults to 1 / sqrt(d). With causal=True the
    queries are the last T_q positions of the T_k keys (bottom-right aligned), so query j
    sees keys 0 .. T_k - T_q + j. upcast=True computes in float32 (the oracle); upcast=False
    computes in q's dtype, which is how the low-precision error of the same math is measured.
    The scores are `attention_logits_ref`'s (softcapped when softcap is given, limited to the last
    `window` positions when window is given). Returns
    [B, H, T_q, d] in q's dtype, saturated at its largest finite value (`saturating_cast`).
    """
    n_rep = q.shape[1] // k.shape[1]
    dtype = torch.float32 if upcast else q.dtype
    vc = v.to(dtype).repeat_interleave(n_rep, dim=1)
    probs = torch.softmax(
        attention_logits_ref(q, k, scale=scale, causal=causal, upcast=upcast, softcap=softcap, window=window),
        dim=-1,
    )
    return saturating_cast(torch.matmul(probs, vc), q.dtype)
