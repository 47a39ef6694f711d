"""Per-token precision (TriAxialKV's storage, role-aware PN-Mix): the classes, the leftover rule,
requantized groups when decoding completes them, exact storage, refusals by name."""

import pytest
import torch

from reference import channel_mask_from_pairs, prefill_pair_mask, quantize_keys
from reference.equations.quant import dequantize, quantize
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import (
    TokenClasses,
    TokenPrecisionConfig,
    bits_per_element,
    precision_cost,
    storage_model,
    token_classes,
)
from reference.tokens.distortion import tag_distortion

TRIAXIAL = TokenPrecisionConfig()
ROLE_AWARE = TokenPrecisionConfig(low_keys="pairs")


def qkv(length=100, heads=2, d=64, seed=0, n_rep=2):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads * n_rep, length, d, generator=gen).half()
    return q, *(torch.randn(1, heads, length, d, generator=gen).half() for _ in range(2))


def pattern(length, n_low, seed=0):
    bits = torch.full((length,), 4)
    bits[torch.randperm(length, generator=torch.Generator().manual_seed(seed))[:n_low]] = 2
    return bits


def per_token(x, bits):
    return dequantize(quantize(x, bits, 32, -1, midpoint=False), 32, -1)


def test_high_tokens_are_per_token_groups_of_32_channels():
    q, k, v = qkv()
    cache = TokenPrecisionCache()
    cache.prefill(q, k, v, torch.full((100,), 4))
    k_hat, v_hat = cache.dequantize()
    assert torch.equal(k_hat, per_token(k, 4)) and torch.equal(v_hat, per_token(v, 4))


@pytest.mark.parametrize("config", [TRIAXIAL, ROLE_AWARE], ids=["triaxialkv", "role-aware"])
def test_low_keys_group_per_channel_over_the_low_tokens_in_order_and_the_leftover_is_high(config):
    q, k, v = qkv(length=96)
    bits = pattern(96, 70)
    low, high = torch.nonzero(bits == 2).flatten(), torch.nonzero(bits == 4).flatten()
    cache = TokenPrecisionCache(config)
    cache.prefill(q, k, v, bits)
    k_hat, v_hat = cache.dequantize()
    grouped, leftover = low[:64], low[64:]
    low_cfg = config.low_key_config
    if config.low_keys == "pairs":  # H3(50%)L1 with the pairs of Eq. 6 over the whole prompt
        mask = channel_mask_from_pairs(prefill_pair_mask(q, k, low_cfg), "split")
        assert (low_cfg.b_high, low_cfg.b_low, int(mask.sum())) == (3, 1, 2 * 32)
    else:
        mask = torch.zeros(1, 2, 64, dtype=torch.bool)
    want = quantize_keys(k[..., grouped, :], mask, low_cfg.b_high, low_cfg.b_low, 32, midpoint=True)
    assert torch.equal(k_hat[..., grouped, :], dequantize(want, 32, -2))
    assert torch.equal(k_hat[..., leftover, :], per_token(k[..., leftover, :], 4))  # 6 leftover keys at 4 bits
    assert torch.equal(v_hat[..., low, :], per_token(v[..., low, :], 2))  # their values stay 2-bit
    assert torch.equal(k_hat[..., high, :], per_token(k[..., high, :], 4))


def test_decoding_completes_a_group_from_the_leftover_as_stored_however_tokens_are_split():
    q, k, v = qkv(length=60)
    bits = torch.full((60,), 2)
    bits[[25, 41]] = 4

    def cache_after(splits):
        cache, at = TokenPrecisionCache(), 20
        cache.prefill(q[..., :at, :], k[..., :at, :], v[..., :at, :], bits[:at])  # 20 low: all leftover
        for n in splits:
            cache.append(k[..., at : at + n, :], v[..., at : at + n, :], bits[at : at + n])
            at += n
        return cache

    cache = cache_after([40])
    low = torch.nonzero(bits == 2).flatten()  # 58 low tokens: one group of 32, 26 leftover
    k_hat, _ = cache.dequantize()
    group = per_token(k[..., low[:32], :], 4)  # every appended low key is stored at 4 bits first
    assert torch.equal(k_hat[..., low[:32], :], dequantize(quantize(group, 2, 32, -2, midpoint=False), 32, -2))
    assert torch.equal(k_hat[..., low[32:], :], per_token(k[..., low[32:], :], 4))
    assert token_classes(TRIAXIAL, cache.token_bits()) == TokenClasses(32, 26, 2)
    for splits in ([1] * 40, [7, 13, 20], [12, 28]):
        other = cache_after(splits)
        assert all(torch.equal(a, b) for a, b in zip(other.dequantize(), cache.dequantize(), strict=True)), splits
        assert other.storage() == cache.storage()


def test_storage_is_counted_exactly():
    # H_kv = 2, T = 100, d = 64, 70 low tokens: 64 grouped (2 groups), 6 leftover, 30 high.
    q, k, v = qkv()
    bits = pattern(100, 70)
    cache = TokenPrecisionCache()
    cache.prefill(q, k, v, bits)
    got = cache.storage()
    assert got == storage_model(TRIAXIAL, 1, 2, 64, bits)
    assert got["low_key_low"] == 2 * 64 * 64 * 2 // 8 and got["low_key_scale"] == 2 * 2 * 64 * 2
    assert got["leftover_key"] == 2 * 6 * 64 * 4 // 8 and got["high_key"] == 2 * 30 * 64 * 4 // 8
    assert got["low_value"] == 2 * 70 * 64 * 2 // 8 and got["high_value_zero"] == 2 * 30 * 2 * 2
    assert got["token_bits"] == 100 and got["pair_mask"] == 0
    cost = bits_per_element(TRIAXIAL, 64, bits, kv_heads=2)
    assert cost.key == pytest.approx((64 * 3 + 36 * 5) / 100) and cost.value == pytest.approx((70 * 3 + 30 * 5) / 100)
    assert cost.key_metadata == pytest.approx(8 * 100 / (100 * 64 * 2))
    assert precision_cost(TRIAXIAL, 2) == 3 and precision_cost(TRIAXIAL, 4) == 5


def test_role_aware_costs_what_triaxialkv_does_plus_its_pair_mask():
    bits = pattern(100, 70)
    tri, pairs = bits_per_element(TRIAXIAL, 64, bits), bits_per_element(ROLE_AWARE, 64, bits)
    assert (pairs.key, pairs.value) == (tri.key, tri.value)
    assert pairs.key_metadata - tri.key_metadata == pytest.approx(4 * 8 / (100 * 64))  # 32 pairs in 4 bytes


def test_a_refused_call_names_its_argument_and_changes_nothing():
    q, k, v = qkv(length=20)
    cache = TokenPrecisionCache()
    cache.prefill(q[..., :10, :], k[..., :10, :], v[..., :10, :], [2] * 10)
    before = cache.stored()
    bad = [
        (([2] * 9,), ValueError, r"token_bits must be \[10\]"),
        (([3] * 10,), ValueError, r"token_bits must hold only \(2, 4\)"),
        ((torch.full((10,), 2.0),), TypeError, "token_bits must hold integers"),
        (("2222222222",), TypeError, "token_bits must be a sequence"),
    ]
    for (bits,), error, match in bad:
        with pytest.raises(error, match=match):
            cache.append(k[..., 10:, :], v[..., 10:, :], bits)
    with pytest.raises(ValueError, match="k contains NaN"):
        cache.append(torch.full_like(k[..., 10:, :], float("nan")), v[..., 10:, :], [2] * 10)
    assert cache.length == 10 and all(torch.equal(before[n], x) for n, x in cache.stored().items())
    with pytest.raises(ValueError, match=r"head_dim \(48\) must be a multiple of group_size \(32\)"):
        TokenPrecisionCache().prefill(*(t[..., :48] for t in qkv(length=4, d=64)), [4] * 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"low_bits": 4, "high_bits": 4}, "high_bits must be > low_bits"),
        ({"low_bits": 1, "low_keys": "pairs"}, "low_bits must be 2..7"),
        ({"low_keys": "tokens"}, "low_keys must be one of"),
        ({"group_size": 12}, "group_size must be a positive multiple of 8"),
        ({"ratio": 1.5}, r"ratio must be in \[0, 1\]"),
    ],
)
def test_bad_configs_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TokenPrecisionConfig(**kwargs)


def test_tag_distortion_is_zero_where_nothing_changes_and_falls_with_more_bits():
    from reference.equations.attention import attention_ref

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 40, 32, generator=gen) for _ in range(3))
    k, v = k[:2], v[:2]  # GQA 2
    tags = ["a"] * 20 + ["b"] * 19 + ["c"]
    d = tag_distortion(q, k, v, tags, ["a", "b", "absent"])
    assert d.shape == (3, 2) and bool(torch.isnan(d[2]).all())
    assert bool((d[:2, 1] < d[:2, 0]).all())  # 4 bits distort less than 2
    # by hand for tag "b" at 4 bits: every token at 4 bits, then only b's tokens taken from that
    idx = torch.arange(20, 39)
    k_hat, v_hat = k.clone(), v.clone()
    k_hat[:, idx], v_hat[:, idx] = per_token(k[:, idx], 4), per_token(v[:, idx], 4)
    exact = attention_ref(q[None], k[None], v[None], causal=True)[0]
    approx = attention_ref(q[None], k_hat[None], v_hat[None], causal=True)[0]
    assert float(d[1, 1]) == pytest.approx(float(((approx - exact) ** 2).mean(dim=(1, 2)).max()))
    with pytest.raises(ValueError, match="one tag per token"):
        tag_distortion(q, k, v, tags[:-1], ["a"])


@pytest.mark.parametrize("config", [TRIAXIAL, ROLE_AWARE], ids=["triaxialkv", "role-aware"])
def test_stepwise_attention_is_token_by_token_decoding(config):
    q, k, v = qkv(length=90, seed=4)
    bits = torch.where(torch.rand(90, generator=torch.Generator().manual_seed(1)) < 0.8, 2, 4)
    prompt = 30
    one, chunked = TokenPrecisionCache(config), TokenPrecisionCache(config)
    for cache in (one, chunked):
        cache.prefill(q[..., :prompt, :], k[..., :prompt, :], v[..., :prompt, :], bits[:prompt])
    expected = []
    for t in range(prompt, 90):
        one.append(k[..., t : t + 1, :], v[..., t : t + 1, :], bits[t : t + 1])
        expected.append(one.attend(q[..., t : t + 1, :], scale=0.2))
    got, plain = [], []
    for a in range(prompt, 90, 25):  # chunks of 25: groups of 32 low keys form inside them
        b = min(a + 25, 90)
        before = chunked.leftover_keys()
        chunked.append(k[..., a:b, :], v[..., a:b, :], bits[a:b])
        got.append(chunked.attend_stepwise(q[..., a:b, :], before, k[..., a:b, :], scale=0.2))
        plain.append(chunked.attend(q[..., a:b, :], scale=0.2))
    expected, got, plain = torch.cat(expected, 2).float(), torch.cat(got, 2).float(), torch.cat(plain, 2).float()
    # Two float32 sums in another order, rounded to float16: a unit of the last place either side, and near
    # zero (subnormal outputs) float32's own error, far under float16's smallest normal 2^-14.
    ulp = 2.0**-9 * expected.abs() + 2.0**-18
    assert bool(((got - expected).abs() <= ulp).all()), float((got - expected).abs().max())
    assert float((plain - expected).abs().max()) > 10 * float(ulp.max())  # reading groups as formed would differ


@pytest.mark.parametrize("config", [TRIAXIAL, ROLE_AWARE], ids=["triaxialkv", "role-aware"])
def test_selected_rows_hold_what_a_cache_of_those_rows_alone_holds(config):
    q, k, v = (torch.cat([x, x.flip(0) * 0.5 + 0.1]) for x in qkv(length=70))  # two rows that differ
    bits = pattern(70, 40)
    rows = torch.tensor([1, 0, 1])
    selected, alone = TokenPrecisionCache(config), TokenPrecisionCache(config)
    selected.prefill(q, k, v, bits)
    selected.append(k[..., :5, :], v[..., :5, :], bits[:5])
    selected.select_rows(rows)
    alone.prefill(q[rows], k[rows], v[rows], bits)
    alone.append(k[rows][..., :5, :], v[rows][..., :5, :], bits[:5])
    for got, expected in zip(selected.dequantize(), alone.dequantize(), strict=True):
        assert torch.equal(got, expected)
    assert selected.storage() == alone.storage() and torch.equal(selected.token_bits(), alone.token_bits())
    with pytest.raises(ValueError, match=r"rows 0\.\.2"):
        selected.select_rows(torch.tensor([0, 3]))
