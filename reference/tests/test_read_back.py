"""A flushed page is read back from its packed bytes once, when it flushes: what the caches give back
equals reading every packed byte again at every call, exactly, for every method of the registry."""

import dataclasses

import pytest
import torch

from reference import ReferenceCache, TokenPrecisionCache, methods
from reference.equations import packing, quant
from reference.tokens.cache import PER_TOKEN

B, H, H_KV, D = 1, 4, 2, 32
#: Small pages so that a short sequence flushes many of them (and sliding value windows move).
PAGES = {"group_size": 8, "residual_length": 16, "n_sink": 3}


def tokens(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, h, n, D, generator=gen) * 2).half() for h in (H, H_KV, H_KV)]


def channel_config(name):
    config = methods.config(name)
    if config.n_sink == methods.EVERY_TOKEN:
        return config  # FP16: nothing is ever quantized
    return dataclasses.replace(config, **{**PAGES, "n_sink": min(config.n_sink, PAGES["n_sink"])})


def reread(cache: ReferenceCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Every packed byte read back again (Eq. 2 / Eq. 7 inverted over the whole quantized region)."""
    cfg, t = cache.config, cache._t
    k_q = quant.dequantize(cache.key_codes(), cfg.group_size, dim=-2)
    if cfg.values_quantized:
        v_q = quant.dequantize(cache.value_codes(), cfg.value_group(D), dim=-1)
    else:
        v_q = t["value_payload"].float()
    k = torch.cat([t["sink_key"].float(), k_q, t["residual_key"].float()], dim=-2)
    v = torch.cat([t["sink_value"].float(), v_q, t["residual_value"].float()], dim=-2)
    return k, v


@pytest.mark.parametrize("name", methods.names(precision=methods.CHANNELS))
def test_the_channel_cache_reads_back_what_its_bytes_hold_at_every_step(name):
    q, k, v = tokens(45, 0)
    cache = ReferenceCache.from_prefill(q, k, v, channel_config(name))
    for step, n in enumerate((1, 7, 1, 16, 3, 1, 33)):
        _, k_new, v_new = tokens(n, step + 1)
        cache.append(k_new, v_new)
        got, want = cache.dequantize(), reread(cache)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (name, step)
    query = tokens(2, 99)[0]
    assert torch.equal(cache.attend(query), cache.attend(query))


def test_a_rolled_back_append_takes_its_read_back_pages_with_it():
    q, k, v = tokens(40, 0)
    cache = ReferenceCache.from_prefill(q, k, v, channel_config("PN-Mix"))
    before = cache.dequantize()
    saved = cache.checkpoint()
    cache.append(*tokens(40, 1)[1:])
    cache.roll_back(saved)
    assert all(torch.equal(a, b) for a, b in zip(cache.dequantize(), before, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before, reread(cache), strict=True))


def reread_tokens(cache: TokenPrecisionCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token cache's stores read back again from their packed bytes."""
    cfg, t = cache.config, cache._t
    b, h, _, d = cache._shape
    k = torch.empty(b, h, cache.length, d)
    v = torch.empty_like(k)
    for name, rows in cache._positions().items():
        if name == "low_key":
            low = cfg.low_key_config
            codes = packing.unpack_key_codes(
                t["low_key_low"], t["low_key_high"], cache._channel_mask(), low.b_high, low.b_low
            )
            read = quant.dequantize(quant.Quantized(codes, t["low_key_scale"], t["low_key_zero"]), cfg.group_size, -2)
        else:
            bits = getattr(cfg, PER_TOKEN[name])
            codes = packing.unpack_fields(t[name], bits, dim=-1)
            read = quant.dequantize(quant.Quantized(codes, t[name + "_scale"], t[name + "_zero"]), cfg.group_size, -1)
        (k if name.endswith("key") else v)[..., rows, :] = read
    return k, v


@pytest.mark.parametrize("name", methods.names(precision=methods.TOKENS))
def test_the_token_cache_reads_back_what_its_bytes_hold_at_every_step(name):
    config = methods.config(name, group_size=8)
    gen = torch.Generator().manual_seed(5)

    def bits(n):
        return torch.where(torch.rand(n, generator=gen) < 0.7, config.low_bits, config.high_bits)

    q, k, v = tokens(30, 0)
    cache = TokenPrecisionCache(config)
    cache.prefill(q, k, v, bits(30))
    for step, n in enumerate((1, 5, 1, 9, 17)):
        _, k_new, v_new = tokens(n, step + 1)
        cache.append(k_new, v_new, bits(n))
        got, want = cache.dequantize(), reread_tokens(cache)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (name, step)
