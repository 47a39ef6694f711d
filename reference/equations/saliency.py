"""Eq. 6: channel-pair saliency from prefill queries and keys, and the salient-pair selection."""

from __future__ import annotations

import torch

#: The importance criteria of the paper's Table 9 and Fig. 4.
CRITERIA = ("qk-pair-norm", "k-pair-norm", "k-magnitude", "k-range")


def pair_channels(head_dim: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel indices (first, second) of each RoPE pair i = 0 .. d/2 - 1.

    "adjacent": (2i, 2i + 1), as the paper writes pairs. "split": (i, i + d/2), the
    `rotate_half` layout of Hugging Face Llama/Qwen models.
    """
    i = torch.arange(head_dim // 2)
    if layout == "adjacent":
        return 2 * i, 2 * i + 1
    if layout == "split":
        return i, i + head_dim // 2
    raise ValueError(f"pair_layout must be 'adjacent' or 'split', got {layout!r}")


def pair_norms(x: torch.Tensor, layout: str) -> torch.Tensor:
    """||x[..., pair i]||_2 in float32 for every RoPE pair: [..., d] -> [..., d/2]."""
    first, second = pair_channels(x.shape[-1], layout)
    x = x.float()
    a, b = x[..., first.to(x.device)], x[..., second.to(x.device)]
    return torch.sqrt(a * a + b * b)


def pair_saliency(q: torch.Tensor, k: torch.Tensor, layout: str) -> torch.Tensor:
    """Eq. 6: sigma[b, h, i] = mean_{h' -> h} mean_t ||q[b,h',t,i]|| * mean_s ||k[b,h,s,i]||.

    q: [B, H, T, d] and k: [B, H_kv, T, d], post-RoPE prefill states. Query head h' reads
    KV head h' // n_rep (n_rep = H / H_kv, the `repeat_kv` order). Returns float32 [B, H_kv, d/2].
    """
    batch, n_heads, _, head_dim = q.shape
    n_kv = k.shape[1]
    n_rep = n_heads // n_kv
    q_mean = pair_norms(q, layout).mean(dim=2)  # [B, H, d/2]
    q_group = q_mean.view(batch, n_kv, n_rep, head_dim // 2).mean(dim=2)
    k_mean = pair_norms(k, layout).mean(dim=2)  # [B, H_kv, d/2]
    return q_group * k_mean


def select_salient_pairs(sigma: torch.Tensor, n_salient: int) -> torch.Tensor:
    """Top `n_salient` pairs of each [..., d/2] row of sigma as a bool pair mask.

    Ties are broken towards the lower pair index (a stable descending sort).
    """
    order = torch.sort(sigma, dim=-1, descending=True, stable=True).indices
    mask = torch.zeros_like(sigma, dtype=torch.bool)
    return mask.scatter(-1, order[..., :n_salient], True)


def channel_mask_from_pairs(pair_mask: torch.Tensor, layout: str) -> torch.Tensor:
    """Expand a pair mask [..., d/2] to a channel mask [..., d]: both channels of a pair share it."""
    if layout == "adjacent":
        return pair_mask.repeat_interleave(2, dim=-1)
    if layout == "split":
        return torch.cat([pair_mask, pair_mask], dim=-1)
    raise ValueError(f"pair_layout must be 'adjacent' or 'split', got {layout!r}")


def criterion_scores(criterion: str, q: torch.Tensor, k: torch.Tensor, layout: str) -> torch.Tensor:
    """Pair scores [B, H_kv, d/2] over the given tokens (prefill only, or the full sequence).

    "qk-pair-norm": Eq. 6 (PN-Mix). "k-pair-norm": mean_s ||k[s, pair i]||. "k-magnitude":
    mean_s |k| of the pair's two channels, summed. "k-range": max_s k - min_s k of the two
    channels, summed. q: [B, H, T, d] (used by qk-pair-norm only), k: [B, H_kv, T, d].
    """
    if criterion == "qk-pair-norm":
        return pair_saliency(q, k, layout)
    if criterion == "k-pair-norm":
        return pair_norms(k, layout).mean(dim=2)
    first, second = (c.to(k.device) for c in pair_channels(k.shape[-1], layout))
    kf = k.float()
    if criterion == "k-magnitude":
        per_channel = kf.abs().mean(dim=2)
    elif criterion == "k-range":
        per_channel = kf.amax(dim=2) - kf.amin(dim=2)
    else:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    return per_channel[..., first] + per_channel[..., second]


def prefill_pair_mask(q: torch.Tensor, k: torch.Tensor, config) -> torch.Tensor:
    """The selection made once at prefill: config.criterion (Eq. 6 for PN-Mix) over the prompt,
    top floor(r * d / 2) pairs per sequence and KV head.

    q: [B, H, T, d], k: [B, H_kv, T, d] post-RoPE prefill states; returns bool [B, H_kv, d/2].
    """
    scores = criterion_scores(config.criterion, q, k, config.pair_layout)
    return select_salient_pairs(scores, config.n_salient_pairs(k.shape[-1]))


def page_channel_ranks(k: torch.Tensor, group_size: int, n_boost: int) -> torch.Tensor:
    """Kitty's per-page selection: rank of every channel within its page of group_size keys.

    Channels are scored by mean |k| over the page's own keys; the n_boost highest (ties to the
    lower index) come first in ascending channel order, then the rest in ascending order.
    k: [B, H_kv, T, d] with T a multiple of group_size; returns uint8 [B, H_kv, T / G, d];
    a channel is boosted where its rank < n_boost.
    """
    score = k.float().abs().unflatten(-2, (k.shape[-2] // group_size, group_size)).mean(-2)
    top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :n_boost]
    boosted = torch.zeros_like(score, dtype=torch.bool).scatter(-1, top, True)
    order = torch.sort((~boosted).to(torch.uint8), dim=-1, stable=True).indices
    positions = torch.arange(score.shape[-1], device=k.device).expand_as(order)
    return torch.empty_like(order).scatter(-1, order, positions).to(torch.uint8)
