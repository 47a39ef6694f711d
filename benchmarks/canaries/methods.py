"""A method's canary: its spec cache (`reference.ReferenceCache`, or `reference.tokens.TokenPrecisionCache` for
per-token precision) fed the seeded workload: a prompt, then token-by-token appends that fill, flush and slide
every region; then decode attention for a seeded query.

Exact: the bytes of every stored tensor, the channel or pair masks, the argmax of each head's scores.
Floats: the attention output (`outcome.summary`).
"""

from __future__ import annotations

import torch

from benchmarks.canaries import workloads
from benchmarks.canaries.outcome import digest, outcome, summary
from reference import ReferenceCache
from reference.methods import method
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig


def _stored(cache) -> dict[str, torch.Tensor]:
    if isinstance(cache, TokenPrecisionCache):
        return cache.stored()
    sink_k, sink_v = cache.sinks()
    res_k, res_v = cache.residual()
    return {**cache.packed(), "sink_key": sink_k, "sink_value": sink_v, "residual_key": res_k, "residual_value": res_v}


def _mask(cache) -> torch.Tensor:
    if isinstance(cache, TokenPrecisionCache):
        return cache.pair_mask if cache.config.low_keys == "pairs" else torch.zeros(0, dtype=torch.bool)
    return cache.page_channel_masks() if cache.config.selection == "page-channels" else cache.channel_mask


def run(name: str) -> dict:
    """The canary of the method `name` (a key of `reference.methods.REGISTRY`)."""
    config = workloads.small_pages(method(name).config())
    q, k, v = workloads.qkv(seed=1, tokens=workloads.PROMPT + workloads.APPENDS)
    p = workloads.PROMPT
    per_token = isinstance(config, TokenPrecisionConfig)
    bits = workloads.token_bits(config, k.shape[2], seed=2) if per_token else None
    if per_token:
        cache = TokenPrecisionCache(config)
        cache.prefill(q[:, :, :p], k[:, :, :p], v[:, :, :p], bits[:p])
    else:
        cache = ReferenceCache.from_prefill(q[:, :, :p], k[:, :, :p], v[:, :, :p], config)
    for t in range(p, k.shape[2]):
        step = slice(t, t + 1)
        if per_token:
            cache.append(k[:, :, step], v[:, :, step], bits[step])
        else:
            cache.append(k[:, :, step], v[:, :, step])
    query = workloads.qkv(seed=3, tokens=1)[0]
    out = cache.attend(query)
    keys, _ = cache.dequantize()
    group = query.shape[1] // keys.shape[1]
    scores = query @ keys.repeat_interleave(group, dim=1).transpose(-1, -2)
    stored = _stored(cache)
    exact = {
        "stored": digest(*(stored[n] for n in sorted(stored))),
        "mask": digest(_mask(cache)),
        "argmax": scores.argmax(-1).flatten().tolist(),
    }
    return outcome(exact, {"attention": summary(out)})
