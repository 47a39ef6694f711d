"""Per-token precision (TriAxialKV's quantizer): the classes, the leftover rule, exact storage."""

import pytest
import torch

from reference.quant import dequantize, quantize
from reference.token_precision import quantize_tokens


def kv(heads=2, length=100, d=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(heads, length, d, generator=gen).half(), torch.randn(heads, length, d, generator=gen).half())


def pattern(length, n_low, seed=0):
    bits = torch.full((length,), 4)
    bits[torch.randperm(length, generator=torch.Generator().manual_seed(seed))[:n_low]] = 2
    return bits


def test_all_four_bit_tokens_are_per_token_groups_of_32_channels():
    k, v = kv()
    k_hat, v_hat = quantize_tokens(k, v, torch.full((100,), 4)).dequantize()
    assert torch.equal(k_hat, dequantize(quantize(k, 4, 32, -1, midpoint=False), 32, -1))
    assert torch.equal(v_hat, dequantize(quantize(v, 4, 32, -1, midpoint=False), 32, -1))


def test_two_bit_keys_group_per_channel_over_the_two_bit_tokens_in_order():
    k, v = kv(length=96)
    bits = pattern(96, 70)
    low = torch.nonzero(bits == 2).flatten()
    stored = quantize_tokens(k, v, bits)
    k_hat, v_hat = stored.dequantize()
    grouped, leftover = low[:64], low[64:]
    assert torch.equal(k_hat[:, grouped], dequantize(quantize(k[:, grouped], 2, 32, -2, midpoint=False), 32, -2))
    # the 6 tokens past the last whole group: keys on the 4-bit per-token path, values still 2-bit
    assert torch.equal(k_hat[:, leftover], dequantize(quantize(k[:, leftover], 4, 32, -1, midpoint=False), 32, -1))
    assert torch.equal(v_hat[:, low], dequantize(quantize(v[:, low], 2, 32, -1, midpoint=False), 32, -1))
    high = torch.nonzero(bits == 4).flatten()
    assert torch.equal(k_hat[:, high], dequantize(quantize(k[:, high], 4, 32, -1, midpoint=False), 32, -1))


def test_storage_is_counted_exactly():
    # H = 2, T = 100, d = 64, 70 two-bit tokens: 64 grouped (2 groups), 6 leftover, 30 four-bit.
    stored = quantize_tokens(*kv(), pattern(100, 70))
    bits = stored.storage_bits()
    assert bits["key_int2"] == 2 * 64 * 64 * 2 and bits["key_int2_params"] == 2 * 2 * 64 * 2 * 16
    assert bits["key_int4"] == 2 * 36 * 64 * 4 and bits["key_int4_params"] == 2 * 36 * 2 * 2 * 16
    assert bits["value_int2"] == 2 * 70 * 64 * 2 and bits["value_int2_params"] == 2 * 70 * 2 * 2 * 16
    assert bits["value_int4"] == 2 * 30 * 64 * 4 and bits["value_int4_params"] == 2 * 30 * 2 * 2 * 16
    key, value = stored.bits_per_element()
    assert key == pytest.approx((64 * 3 + 36 * 5) / 100) and value == pytest.approx((70 * 3 + 30 * 5) / 100)


def test_no_token_of_a_precision_is_fine():
    k, v = kv(length=8)
    k_hat, _ = quantize_tokens(k, v, torch.full((8,), 2)).dequantize()  # all leftover: 4-bit keys
    assert torch.equal(k_hat, dequantize(quantize(k, 4, 32, -1, midpoint=False), 32, -1))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"bits": torch.full((5,), 4)}, r"bits must be \[100\]"),
        ({"bits": torch.full((100,), 3)}, r"bits must be one of \(2, 4\)"),
        ({"group_size": 48}, r"group_size \(48\) must divide head_dim \(64\)"),
        ({"k": torch.zeros(2, 100, 32)}, "k and v must both be"),
        ({"k": torch.full((2, 100, 64), float("nan"))}, "finite"),
    ],
)
def test_bad_input_is_refused_by_name(change, match):
    k, v = kv()
    args = {"k": k, "v": v, "bits": pattern(100, 50)} | change
    group = args.pop("group_size", 32)
    with pytest.raises(ValueError, match=match):
        quantize_tokens(args["k"], args["v"], args["bits"], group_size=group)


def test_tag_distortion_is_zero_where_nothing_changes_and_falls_with_more_bits():
    from reference.attention import attention_ref
    from reference.token_precision import tag_distortion

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 40, 32, generator=gen) for _ in range(3))
    k, v = k[:2], v[:2]  # GQA 2
    tags = ["a"] * 20 + ["b"] * 19 + ["c"]
    d = tag_distortion(q, k, v, tags, ["a", "b", "absent"])
    assert d.shape == (3, 2) and bool(torch.isnan(d[2]).all())
    assert bool((d[:2, 1] < d[:2, 0]).all())  # 4 bits distort less than 2
    # by hand for tag "b" at 4 bits: its tokens quantized alone, the worst head's MSE
    idx = torch.arange(20, 39)
    k_hat, v_hat = k.clone(), v.clone()
    k_hat[:, idx], v_hat[:, idx] = quantize_tokens(k[:, idx], v[:, idx], torch.full((19,), 4)).dequantize()
    exact = attention_ref(q[None], k[None], v[None], causal=True)[0]
    approx = attention_ref(q[None], k_hat[None], v_hat[None], causal=True)[0]
    assert float(d[1, 1]) == pytest.approx(float(((approx - exact) ** 2).mean(dim=(1, 2)).max()))
    with pytest.raises(ValueError, match="one tag per token"):
        tag_distortion(q, k, v, tags[:-1], ["a"])
