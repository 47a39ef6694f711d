"""Each kernel against the spec across a parametrized grid (awkward sizes on purpose).

Exact things (scales, zeros, packed bytes, codes, dequantized values) are compared with
torch.equal; attention uses the suite's measured-tolerance policy.
"""

import dataclasses
import re

import pytest
import torch
import triton
import triton.language as tl

import reference as R
from pnmix import PNMixCache, _runtime
from pnmix.kernels import decode_attention, dequantize_plane, encode_pack, group_params
from pnmix.kernels.attention import _code_to
from reference import methods
from reference.contract.tolerances import attention_bound
from reference.equations import packing

pytestmark = pytest.mark.interpreter if _runtime.INTERPRETED else pytest.mark.gpu
DEV = _runtime.kernel_device()


def data(shape, dtype, seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(DEV)


def slot_of(channel_mask):
    index = packing.salient_channel_index(channel_mask).to(torch.int32).contiguous()
    return index, packing.high_plane_columns(channel_mask)


@pytest.mark.parametrize(("b_high", "b_low"), [(3, 1), (4, 2), (4, 1), (2, 2), (8, 3), (1, 1)])
@pytest.mark.parametrize("group", [8, 24])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [12, 20])
def test_key_quantize_pack_is_bit_identical(b_high, b_low, group, dtype, head_dim):
    b, h, t = 2, 3, 2 * group
    k = data((b, h, t, head_dim), dtype, b_high * 7 + group)
    pairs = R.select_salient_pairs(torch.rand(b, h, head_dim // 2, generator=torch.Generator().manual_seed(1)), 3)
    channel = R.channel_mask_from_pairs(pairs, "split").to(DEV)
    bits = torch.where(channel, b_high, b_low).to(torch.int32)
    ref = R.quantize_keys(k.cpu(), channel.cpu(), b_high, b_low, group)
    scale = torch.empty(b, h, t // group, head_dim, dtype=torch.float16, device=DEV)
    zero = torch.empty_like(scale)
    group_params(k, group, "tokens", bits, scale, zero)
    assert torch.equal(scale.cpu(), ref.scale) and torch.equal(zero.cpu(), ref.zero)
    ref_low, ref_high = R.pack_key_codes(ref.codes, channel.cpu(), b_high, b_low)
    low = torch.empty(ref_low.shape, dtype=torch.uint8, device=DEV)
    encode_pack(k, group, "tokens", bits, scale, zero, low, field_bits=b_low)
    assert torch.equal(low.cpu(), ref_low)
    index, slot = slot_of(channel)
    high = torch.zeros(ref_high.shape, dtype=torch.uint8, device=DEV)
    if b_high > b_low:
        encode_pack(k, group, "tokens", bits, scale, zero, high, field_bits=b_high - b_low, shift=b_low, colmap=index)
    assert torch.equal(high.cpu(), ref_high)
    out = torch.empty(b, h, t, head_dim, device=DEV)
    dequantize_plane(
        low,
        scale,
        zero,
        out,
        group=group,
        along="tokens",
        low_bits=b_low,
        high=high,
        high_bits=b_high - b_low,
        slot=slot,
    )
    assert torch.equal(out.cpu(), R.dequantize(ref, group, -2))


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(("head_dim", "group"), [(16, 16), (24, 8), (32, 16)])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_value_quantize_pack_is_bit_identical(bits, head_dim, group, scale_dtype):
    b, h, t = 3, 1, 17
    v = data((b, h, t, head_dim), torch.bfloat16, bits + head_dim)
    ref = R.quantize(v.cpu(), bits, group, -1, scale_dtype)
    scale = torch.empty(b, h, t, head_dim // group, dtype=scale_dtype, device=DEV)
    zero = torch.empty_like(scale)
    group_params(v, group, "channels", bits, scale, zero)
    assert torch.equal(scale.cpu(), ref.scale) and torch.equal(zero.cpu(), ref.zero)
    packed = torch.empty(b, h, t, head_dim * bits // 8, dtype=torch.uint8, device=DEV)
    encode_pack(v, group, "channels", bits, scale, zero, packed, field_bits=bits)
    assert torch.equal(packed.cpu(), R.pack_value_codes(ref.codes, bits))
    out = torch.empty(b, h, t, head_dim, device=DEV)
    dequantize_plane(packed, scale, zero, out, group=group, along="channels", low_bits=bits)
    assert torch.equal(out.cpu(), R.dequantize(ref, group, -1))


def check_decode_attention(cfg, d, batch, n_kv, n_rep, length, t_new, splits, dtype):
    q = data((batch, n_kv * n_rep, length, d), dtype, 1, 1.0)
    k, v = data((batch, n_kv, length, d), dtype, 2), data((batch, n_kv, length, d), dtype, 3)
    cache = PNMixCache.from_prefill(q, k, v, cfg)
    ref = R.ReferenceCache.from_prefill(q.cpu(), k.cpu(), v.cpu(), cfg)
    new_q = data((batch, n_kv * n_rep, t_new, d), dtype, 4, 1.0)
    out = cache.attend(new_q, num_splits=splits).cpu()
    k_hat, v_hat = ref.dequantize()
    oracle = R.attention_ref(new_q.cpu().double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = R.attention_ref(new_q.cpu(), k_hat.to(dtype), v_hat.to(dtype), causal=True, upcast=False)
    err = (out.double() - oracle).abs().max().item()
    bound = attention_bound(oracle, low, dtype)
    print(f"max err {err:.3g}, bound {bound:.3g}")
    assert err <= bound


@pytest.mark.parametrize(("batch", "n_kv", "n_rep"), [(1, 1, 1), (3, 2, 4), (2, 1, 7)])
@pytest.mark.parametrize(("length", "t_new"), [(1, 1), (17, 1), (17, 2), (54, 1), (97, 1), (97, 3)])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_matches_the_spec(batch, n_kv, n_rep, length, t_new, splits, dtype):
    """Key groups smaller than a tile: the per-element path."""
    cfg = R.PNMixConfig(group_size=8, residual_length=16, n_sink=5, pair_layout="adjacent")
    check_decode_attention(cfg, 16, batch, n_kv, n_rep, length, t_new, splits, dtype)


@pytest.mark.parametrize(("b_high", "b_low", "value_bits"), [(4, 1, 3), (8, 3, 1), (7, 1, 6)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_per_element_path_reads_every_bit_plane(b_high, b_low, value_bits, dtype):
    """Fields of several bit planes (3, 5, 6, 7 bits) on the per-element path: key groups under a tile,
    value groups under the head."""
    cfg = R.PNMixConfig(
        b_high=b_high,
        b_low=b_low,
        value_bits=value_bits,
        value_group_size=8,
        group_size=8,
        residual_length=16,
        n_sink=3,
    )
    check_decode_attention(cfg, 16, 2, 2, 3, 61, 2, 2, dtype)


@pytest.mark.parametrize(
    ("batch", "n_kv", "n_rep", "length", "t_new", "splits"), [(1, 1, 1, 97, 1, 1), (2, 2, 3, 133, 3, 3)]
)
@pytest.mark.parametrize(
    ("b_high", "b_low", "value_bits", "d"),
    [(3, 1, 2, 16), (4, 2, 4, 32), (2, 1, 1, 16), (4, 1, 3, 16), (8, 3, 2, 16)],  # 3 and 5 bits: several planes
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_fast_path_matches_the_spec(
    batch, n_kv, n_rep, length, t_new, splits, b_high, b_low, value_bits, d, dtype
):
    """Key groups of whole tiles and per-token value groups over the head: codes shifted out
    of vector loads, scale and zero folded into the operands, field-major value columns."""
    cfg = R.PNMixConfig(b_high=b_high, b_low=b_low, value_bits=value_bits, group_size=16, residual_length=16, n_sink=5)
    check_decode_attention(cfg, d, batch, n_kv, n_rep, length, t_new, splits, dtype)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_fast_path_with_scales_of_every_dtype(scale_dtype, dtype):
    """The 1-bit low plane is an exact product (queries as given times where(bit, s, 0), one dot) when the
    scales are stored in the queries' dtype, and q * s as hi + lo otherwise; float32 value scales take the
    values' headroom (p * s may pass float16's range), float16 and bfloat16 ones need none."""
    cfg = R.PNMixConfig(group_size=16, residual_length=16, n_sink=5, scale_dtype=scale_dtype)
    check_decode_attention(cfg, 16, 2, 2, 3, 133, 2, 2, dtype)


@pytest.mark.parametrize(
    ("case", "scale_dtype"),
    [
        ("keys", torch.float16),
        ("keys", torch.float32),
        ("values", torch.float32),
        ("one channel", torch.float16),
        ("one channel", torch.float32),
    ],
)
@pytest.mark.parametrize("big_group", [0, 2])
def test_one_headroom_exponent_per_split_keeps_huge_groups_finite_and_the_rest_accurate(case, scale_dtype, big_group):
    """One split over four key groups of which one is huge, so that the split's headroom exponents
    (`_split_exponents`, the largest of its tiles') are above 1 for every tile, the ordinary ones too, whichever
    group is the huge one (the first tile, or a later one). keys: keys of up to 5e4 and queries of up to ~16,
    whose q * s (the high plane's, and with float32 scales the low plane's) pass float16's range without the
    exponent; values: 1-bit "ends" values of up to 6e4 under float32 scales (s up to 1.2e5: p * s passes it,
    p = 1 at the largest logit, which the group's keys hold); one channel: keys and values of up to 3e4 in a
    channel where the new query is 0, so the logits stay ordinary and every tile's share of the output counts.
    Attention must be finite and within the low-precision error."""
    one_bit = "ends" if case == "values" else "midpoint"
    cfg = R.PNMixConfig(group_size=16, residual_length=16, n_sink=2, scale_dtype=scale_dtype, one_bit=one_bit)
    if case == "values":
        cfg = dataclasses.replace(cfg, value_bits=1)
    length, d = 2 + 4 * 16 + 9, 16
    q = data((1, 2, length, d), torch.float16, 5, 1.0)
    k, v = data((1, 1, length, d), torch.float16, 6), data((1, 1, length, d), torch.float16, 7)
    rows = slice(2 + 16 * big_group, 2 + 16 * (big_group + 1))
    new_q = data((1, 2, 1, d), torch.float16, 8, 4.0 if case == "keys" else 1.0)
    if case == "keys":
        k[:, :, rows] = (k[:, :, rows].float() * 2e4).clamp(-5e4, 5e4).half()
    elif case == "values":
        k[:, :, rows] *= 4
        v[:, :, rows] = (v[:, :, rows].float() * 2e4).clamp(-6e4, 6e4).half()
    else:
        k[:, :, rows, 3] = (k[:, :, rows, 3].float() * 1e4).clamp(-3e4, 3e4).half()
        v[:, :, rows, 3] = (v[:, :, rows, 3].float() * 1e4).clamp(-3e4, 3e4).half()
        new_q[..., 3] = 0
    cache = PNMixCache.from_prefill(q, k, v, cfg)
    out = cache.attend(new_q, num_splits=1).cpu()
    k_hat, v_hat = R.ReferenceCache.from_prefill(q.cpu(), k.cpu(), v.cpu(), cfg).dequantize()
    oracle = R.attention_ref(new_q.cpu().double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = R.attention_ref(new_q.cpu(), k_hat.half(), v_hat.half(), causal=True, upcast=True)
    assert out.isfinite().all()
    err, bound = (out.double() - oracle).abs().max().item(), attention_bound(oracle, low, torch.float16)
    print(f"max err {err:.3g}, bound {bound:.3g}")
    assert err <= bound


@pytest.mark.parametrize("method", ["PN-Mix", "Kitty"])
@pytest.mark.parametrize("d", [256, 200])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_wide_heads_match_the_spec(method, d, dtype):
    """Heads of more than 128 channels: the key dot runs over two chunks of channels (the second
    partly masked at d = 200), the high plane's channels in either; per-page ranks for Kitty."""
    cfg = methods.METHODS[method](group_size=16, residual_length=16, n_sink=3)
    check_decode_attention(cfg, d, 1, 1, 2, 71, 1, 2, dtype)


def test_static_and_dynamic_caches_agree_and_account_exactly():
    cfg = R.PNMixConfig(group_size=8, residual_length=16, n_sink=3)
    q, k, v = (
        data((2, 4, 20, 16), torch.float16, 5),
        data((2, 2, 20, 16), torch.float16, 6),
        data((2, 2, 20, 16), torch.float16, 7),
    )
    static = PNMixCache.from_prefill(q, k, v, cfg, max_cache_len=64)
    dynamic = PNMixCache.from_prefill(q, k, v, cfg)
    allocated = static.storage()
    for step in range(4):
        new_k, new_v = data((2, 2, 11, 16), torch.float16, 10 + step), data((2, 2, 11, 16), torch.float16, 20 + step)
        static.append(new_k, new_v)
        dynamic.append(new_k, new_v)
        assert static.storage() == allocated == R.storage_model(cfg, 2, 2, 16, static.length, capacity=64)
        assert dynamic.storage() == R.storage_model(cfg, 2, 2, 16, dynamic.length)
        assert torch.equal(static.dequantize()[0], dynamic.dequantize()[0])
    new_q = data((2, 4, 1, 16), torch.float16, 30)
    assert torch.equal(static.attend(new_q), dynamic.attend(new_q))
    before = static.storage()
    with pytest.raises(ValueError, match="past its capacity max_cache_len=64"):
        static.append(*[data((2, 2, 1, 16), torch.float16, 40)] * 2)
    assert static.length == 64 and static.storage() == before


def test_prompt_longer_than_capacity_is_rejected():
    t = data((1, 1, 10, 8), torch.float16, 1)
    with pytest.raises(ValueError, match="past its capacity max_cache_len=9"):
        PNMixCache.from_prefill(t, t, t, max_cache_len=9)
    with pytest.raises(ValueError, match="max_cache_len must be a positive int"):
        PNMixCache(max_cache_len=0)


@pytest.mark.skipif(not _runtime.INTERPRETED, reason="checks the interpreter's device rule")
def test_tensors_off_the_kernel_device_are_rejected_by_name():
    t = torch.zeros(1, 1, 4, 8, device="meta", dtype=torch.float16)
    with pytest.raises(ValueError, match="q must be on cpu for the Triton interpreter"):
        PNMixCache.from_prefill(t, t, t)


def test_attention_keeps_the_graph_as_the_spec_does_and_a_backward_fails_by_name():
    t = data((1, 1, 12, 8), torch.float16, 1)
    cache = PNMixCache.from_prefill(t, t, t)
    q = data((1, 1, 1, 8), torch.float16, 2).requires_grad_()
    out = cache.attend(q)
    assert out.requires_grad and R.ReferenceCache.from_prefill(t.cpu(), t.cpu(), t.cpu()).attend(q.cpu()).requires_grad
    assert torch.equal(out.detach(), cache.attend(q.detach()))
    with pytest.raises(RuntimeError, match="Triton decode attention has no backward"):
        out.sum().backward()
    with torch.no_grad():
        assert not cache.attend(q).requires_grad


def test_float32_inputs_are_rejected_clearly():
    t = data((1, 1, 4, 8), torch.float32, 1)
    with pytest.raises(TypeError, match="k must be float16 or bfloat16 for PNMixCache"):
        PNMixCache.from_prefill(t, t, t)


@pytest.mark.parametrize(
    "method",
    [
        pytest.param(lambda: methods.kivi(2, group_size=8), id="kivi-2"),
        pytest.param(lambda: methods.kivi(1, group_size=8, n_sink=3), id="kivi-1-sinks"),
        pytest.param(lambda: methods.kitty(group_size=8, residual_length=16), id="kitty"),
        pytest.param(lambda: methods.kitty(light=True, group_size=8, residual_length=8, n_sink=0), id="kitty-light"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("capacity", [None, 80])
def test_baselines_on_the_same_kernels_match_the_spec(method, dtype, capacity):
    cfg = method()
    q, k, v = data((2, 4, 45, 16), dtype, 1, 1.0), data((2, 2, 45, 16), dtype, 2), data((2, 2, 45, 16), dtype, 3)
    cache = PNMixCache.from_prefill(q, k, v, cfg, max_cache_len=capacity)
    ref = R.ReferenceCache.from_prefill(q.cpu(), k.cpu(), v.cpu(), cfg)
    for step in range(3):
        new_k, new_v = data((2, 2, 5, 16), dtype, 10 + step), data((2, 2, 5, 16), dtype, 20 + step)
        cache.append(new_k, new_v)
        ref.append(new_k.cpu(), new_v.cpu())
    assert torch.equal(cache.key_codes().codes.cpu(), ref.key_codes().codes)
    assert torch.equal(cache.dequantize()[0].cpu(), ref.dequantize()[0])
    assert torch.equal(cache.dequantize()[1].cpu(), ref.dequantize()[1])
    assert cache.storage() == R.storage_model(cfg, 2, 2, 16, cache.length, dtype, capacity=capacity)
    assert cache.saliency_computations == ref.saliency_computations
    new_q = data((2, 4, 1, 16), dtype, 30, 1.0)
    k_hat, v_hat = ref.dequantize()
    oracle = R.attention_ref(new_q.cpu().double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = R.attention_ref(new_q.cpu(), k_hat.to(dtype), v_hat.to(dtype), causal=True, upcast=False)
    err = (cache.attend(new_q, num_splits=2).cpu().double() - oracle).abs().max().item()
    assert err <= attention_bound(oracle, low, dtype)


@triton.jit
def _code_probe(out_ptr, N: tl.constexpr, DOT: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, N), _code_to(tl.arange(0, N), DOT).to(tl.float32))


@pytest.mark.parametrize("dot", ["float16", "bfloat16"])
def test_every_code_converts_exactly_to_the_dot_dtype(dot):
    if dot == "bfloat16" and _runtime.INTERPRETED:
        pytest.skip("the interpreter's bfloat16 arithmetic is not exact (its kernels use float32 operands)")
    out = torch.empty(256, device=DEV)
    _code_probe[(1,)](out, 256, getattr(tl, dot))
    assert torch.equal(out.cpu(), torch.arange(256).float())


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("block_n", 24),
        ("block_n", 8),
        ("num_warps", 3),
        ("num_stages", 0),
        ("num_splits", 1.5),
        ("swap", (1, 0)),
        ("swap", True),
        ("swap", (True, False, True)),
    ],
)
def test_decode_launch_choices_are_checked_by_name(name, value):
    cfg = R.PNMixConfig(group_size=16, residual_length=16, n_sink=2)
    q, k = data((1, 2, 40, 16), torch.float16, 1, 1.0), data((1, 1, 40, 16), torch.float16, 2)
    cache = PNMixCache.from_prefill(q, k, k, cfg)
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}"):
        decode_attention(q[:, :, -1:], cache.region(), cache.cache_layout, **{name: value})


@pytest.mark.parametrize(("block_n", "splits"), [(16, 1), (32, 2), (64, 3)])
def test_every_launch_choice_computes_the_same_attention(block_n, splits):
    """Tiles of G = 32 tokens or a part of one (the fast path), or of two groups (per element)."""
    cfg = R.PNMixConfig(group_size=32, residual_length=32, n_sink=3)
    q = data((1, 4, 150, 32), torch.float16, 1, 1.0)
    k, v = data((1, 2, 150, 32), torch.float16, 2), data((1, 2, 150, 32), torch.float16, 3)
    cache = PNMixCache.from_prefill(q, k, v, cfg)
    region, layout, new_q = cache.region(), cache.cache_layout, q[:, :, -1:]
    out = decode_attention(new_q, region, layout, block_n=block_n, num_splits=splits, num_warps=8, num_stages=2)
    k_hat, v_hat = cache.dequantize()
    oracle = R.attention_ref(new_q.double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = R.attention_ref(new_q, k_hat.to(torch.float16), v_hat.to(torch.float16), causal=True, upcast=True)
    assert (out.double() - oracle).abs().max().item() <= attention_bound(oracle, low, torch.float16)


@pytest.mark.parametrize("swap", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize(
    ("dtype", "scale_dtype"),
    [(torch.float16, torch.float16), (torch.bfloat16, torch.float16), (torch.float16, torch.float32)],
)
def test_every_operand_order_computes_the_same_attention(swap, dtype, scale_dtype):
    """The keys' and the values' dots with their MMA operand roles exchanged or not (`launch_config` picks per
    architecture; the interpreter runs keys swapped, values not): the 1-bit plane as an exact product (float16
    scales and queries), q * s as hi + lo (bfloat16 queries), the values' headroom (float32 scales)."""
    cfg = R.PNMixConfig(group_size=16, residual_length=16, n_sink=5, scale_dtype=scale_dtype)
    q = data((2, 6, 133, 16), dtype, 1, 1.0)
    k, v = data((2, 2, 133, 16), dtype, 2), data((2, 2, 133, 16), dtype, 3)
    cache = PNMixCache.from_prefill(q, k, v, cfg)
    new_q = data((2, 6, 2, 16), dtype, 4, 1.0)
    out = decode_attention(new_q, cache.region(), cache.cache_layout, num_splits=2, swap=swap).cpu()
    k_hat, v_hat = R.ReferenceCache.from_prefill(q.cpu(), k.cpu(), v.cpu(), cfg).dequantize()
    oracle = R.attention_ref(new_q.cpu().double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = R.attention_ref(new_q.cpu(), k_hat.to(dtype), v_hat.to(dtype), causal=True, upcast=False)
    assert (out.double() - oracle).abs().max().item() <= attention_bound(oracle, low, dtype)
