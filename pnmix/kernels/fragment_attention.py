"""Decode attention over a cache whose quantized region is stored in fragment order (pnmix/kernels/NOTES.md, "Codes
in fragment order"): what `PNMixCache` runs where its pages are written in that order.

One decode step is one launch at batch 1, two at large batches: the fragment-order loop
(`fragment_decode.fragment_split_kernel`: the exact regions, sinks and residual, read by a program of their own
beside the quantized splits, or by the last split before its tiles: `fragment_decode.split_plan`), whose last
program of each head merges its splits where its grid is one wave (`perfmodel.merges_in_loop`), else the
package's merge of every split. The loop runs where `fragment_check.decide`
found it right on the device ("ptx" or "plain"); on a CPU its torch twin takes its place ("twin": what the tests
run, and what a cache forced into fragment order computes there). Anything the loop does not cover (more than one
new token, more than 16 query rows per KV head) reads the region converted back to the spec's order by the Triton
kernel: the same answer, slower.
"""

from __future__ import annotations

import math

import torch

from pnmix.kernels import attention, fragment, fragment_decode
from reference import CacheLayout

#: Paths of the quantized region's partials: the loop with its inline-PTX or plain unpack, or its torch twin.
PATHS = ("ptx", "plain", "twin")


def why_not(layout: CacheLayout) -> str | None:
    """Why a cache of `layout` cannot store its quantized region in fragment order (None: it can). The loop is
    written for the default configuration's shape: 1-bit low plane, 2-bit high plane of 64 salient channels of a
    128-channel head, key groups of 128 tokens, 2-bit values in one group per token, float16 or bfloat16 inputs,
    float16 scales, a selection fixed at prefill, values flushed with their keys."""
    cfg, d = layout.config, layout.head_dim
    needs = [
        (d == fragment.HEAD_DIM, f"head_dim {fragment.HEAD_DIM} (got {d})"),
        (cfg.b_low == fragment.LOW_BITS, f"b_low {fragment.LOW_BITS} (got {cfg.b_low})"),
        (
            cfg.b_high - cfg.b_low == fragment.HIGH_BITS,
            f"b_high - b_low {fragment.HIGH_BITS} (got b_high {cfg.b_high})",
        ),
        (
            layout.n_high_channels == fragment.HIGH_CHANNELS,
            f"{fragment.HIGH_CHANNELS} salient channels (got {layout.n_high_channels})",
        ),
        (cfg.group_size == fragment_decode.GROUP, f"group_size {fragment_decode.GROUP} (got {cfg.group_size})"),
        (cfg.values_quantized and cfg.value_bits == fragment.VALUE_BITS, f"{fragment.VALUE_BITS}-bit values"),
        (cfg.value_group(d) == d, "one value group per token over the whole head"),
        (not cfg.selector.per_group, f"a selection fixed at prefill (got {cfg.selector.name})"),
        (cfg.value_residual == "shared", f"value_residual='shared' (got {cfg.value_residual!r})"),
        (cfg.scale_dtype == torch.float16, f"float16 scales (got {cfg.scale_dtype})"),
        (layout.dtype in (torch.float16, torch.bfloat16), f"float16 or bfloat16 keys and values (got {layout.dtype})"),
    ]
    missing = [what for ok, what in needs if not ok]
    return None if not missing else "the fragment-order loop needs " + ", ".join(missing)


def covers(q: torch.Tensor, layout: CacheLayout) -> bool:
    """Whether the loop computes attention for queries `q` [B, H, T_new, d] (else the spec's order is read): one new
    token, at most 16 query rows per KV head."""
    return q.shape[2] == 1 and q.shape[1] // layout.kv_heads <= fragment_decode.QUERY_ROWS


def planes(tensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The key low plane, key high plane and value codes of a region as int32 words, [B * H_kv, words]."""
    return tuple(
        tensors[name].view(torch.int32).flatten(2).flatten(0, 1) for name in ("key_low", "key_high", "value_payload")
    )


def _twin_partials(q, index, tensors, tokens, out, splits, exact_split, total, qk_scale) -> None:
    """The loop's partials computed by its torch twin, head by head, written where the loop writes them."""
    m, l_sum, acc = out
    batch, n_heads = q.shape[:2]
    n_kv = index.shape[1]
    n_rep = n_heads // n_kv
    n_q = tokens.n_quantized
    tiles, groups = n_q // fragment.TILE, n_q // fragment_decode.GROUP
    lo, hi, vp = (p.view(batch, n_kv, -1) for p in planes(tensors))
    for b in range(batch):
        for h in range(n_kv):
            words = torch.cat(
                [
                    lo[b, h, : tiles * 256].view(tiles, fragment.WARPS, 32, 2),
                    hi[b, h, : tiles * 256].view(tiles, fragment.WARPS, 32, 2),
                    vp[b, h, : tiles * 512].view(tiles, fragment.WARPS, 32, 4),
                ],
                dim=-1,
            )
            exact = (
                tensors["sink_key"][b, h, : tokens.n_sink],
                tensors["sink_value"][b, h, : tokens.n_sink],
                tensors["residual_key"][b, h, : tokens.n_residual],
                tensors["residual_value"][b, h, : tokens.n_residual],
            )
            part = fragment_decode.twin(
                q[b, h * n_rep : (h + 1) * n_rep, 0],
                index[b, h],
                words,
                tensors["key_scale"][b, h, :groups],
                tensors["key_zero"][b, h, :groups],
                tensors["value_scale"][b, h, :n_q, 0],
                tensors["value_zero"][b, h, :n_q, 0],
                qk_scale,
                splits,
                exact,
                exact_split,
            )
            first = (b * n_kv + h) * total * n_rep
            rows = slice(first, first + total * n_rep)
            for dst, src in zip((m, l_sum, acc), part, strict=True):
                dst[rows] = src[:, :n_rep].reshape(total * n_rep, *src.shape[2:])


def decode(
    q: torch.Tensor,
    region: attention.PackedRegion,
    layout: CacheLayout,
    index: torch.Tensor,
    path: str,
    *,
    num_splits: int | None = None,
    scale: float | None = None,
    semaphores: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention of q [B, H, 1, d] (`covers`) over a region whose quantized planes are in fragment order:
    [B, H, 1, d] in q's dtype. index: int32 [B, H_kv, 64], each head's salient channels ascending; path: one of
    `PATHS`; num_splits: the loop's splits (None: the package's rule, in key groups); semaphores: int32 zeros, one
    per (sequence, KV head) at least, kept zero by the loop, with which it merges its splits itself where the
    package's rule says so (`perfmodel.merges_in_loop`: a grid of one wave); without them the merge kernel does."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if region.tensors["value_payload"].shape[2] == 0:  # no quantized rows held (a dynamic cache): nothing to reorder
        return attention.decode_attention(q, region, layout, num_splits=num_splits, scale=scale)
    batch, n_heads, _, d = q.shape
    n_kv = layout.kv_heads
    n_rep = n_heads // n_kv
    q = q.contiguous()
    t = region.tokens
    # the package's split rule, in the loop's trips (key groups), as the gate predicts it
    splits = num_splits or attention.default_splits(
        batch * n_kv, region.capacity or t.length, fragment_decode.TOKENS_PER_ITERATION
    )
    quantized, exact_split, total = fragment_decode.plan(splits, batch * n_kv)
    out = attention.partials(batch * n_kv * total * n_rep, d, q.device)
    qk_scale = attention.LOG2E * (1.0 / math.sqrt(d) if scale is None else scale)
    r = region.tensors
    if path == "twin":
        _twin_partials(q, index, r, t, out, quantized, exact_split, total, qk_scale)
    else:
        counts = region.counts if region.counts is not None else attention.counts_tensor(t, q.device)
        scales = tuple(r[name].flatten(0, 1) for name in ("key_scale", "key_zero", "value_scale", "value_zero"))
        exact = tuple(r[name].flatten(0, 1) for name in ("sink_key", "sink_value", "residual_key", "residual_value"))
        heads = batch * n_kv
        if semaphores is not None and semaphores.numel() >= heads and fragment_decode.merges(heads, total):
            merged = torch.empty_like(q)
            fragment_decode.launch_split(
                q, index, planes(r), scales, exact, counts, out, heads, n_rep, quantized, exact_split, total, 0,
                qk_scale, path == "ptx", merged, semaphores,
            )  # fmt: skip
            return merged
        fragment_decode.launch_split(
            q, index, planes(r), scales, exact, counts, out, heads, n_rep, quantized, exact_split, total, 0,
            qk_scale, path == "ptx",
        )  # fmt: skip
    return attention.merge(*out, q, n_kv, total)
