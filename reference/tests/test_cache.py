"""The online cache: layout, sinks, flushes, mask stability, attention and storage in every state."""

import pytest
import torch

from reference import (
    PNMixConfig,
    ReferenceCache,
    attention_ref,
    channel_mask_from_pairs,
    dequantize,
    methods,
    pair_channels,
    pair_saliency,
    quantize,
    quantize_keys,
    select_salient_pairs,
    storage_model,
    token_layout,
)

B, H, H_KV, D = 2, 4, 2, 16


def tokens(n, seed, dtype=torch.float16, heads=H_KV):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, heads, n, D, generator=gen) * 2).to(dtype)


def expected_kv(cache, all_k, all_v):
    """Dequantized K/V rebuilt from the token history alone, independent of the cache's storage."""
    cfg = cache.config
    tokens = token_layout(cfg, all_k.shape[-2])
    n_sink, n_q, n_vq = tokens.n_sink, tokens.n_quantized, tokens.n_value_quantized
    region, v_region = slice(n_sink, n_sink + n_q), slice(n_sink, n_sink + n_vq)
    mask = cache.channel_mask
    keys = quantize_keys(all_k[..., region, :], mask, cfg.b_high, cfg.b_low, cfg.group_size, cfg.scale_dtype)
    k_q = dequantize(keys, cfg.group_size, -2)
    if cfg.values_quantized:
        vq = quantize(all_v[..., v_region, :], cfg.value_bits, cfg.value_group(D), -1, cfg.scale_dtype)
        v_q = dequantize(vq, cfg.value_group(D), -1)
    else:
        v_q = all_v[..., v_region, :].float()
    k = torch.cat([all_k[..., :n_sink, :].float(), k_q, all_k[..., n_sink + n_q :, :].float()], dim=-2)
    v = torch.cat([all_v[..., :n_sink, :].float(), v_q, all_v[..., n_sink + n_vq :, :].float()], dim=-2)
    return k, v


def check_state(cache, all_k, all_v, seed):
    t = all_k.shape[-2]
    layout = token_layout(cache.config, t)
    n_sink, n_res, n_vres = layout.n_sink, layout.n_residual, layout.n_value_residual
    assert cache.length == t and cache.layout == layout
    assert cache.storage() == storage_model(cache.config, B, H_KV, D, t, all_k.dtype)
    sink_k, sink_v = cache.sinks()
    assert torch.equal(sink_k.view(torch.int16), all_k[..., :n_sink, :].view(torch.int16))
    assert torch.equal(sink_v.view(torch.int16), all_v[..., :n_sink, :].view(torch.int16))
    res_k, res_v = cache.residual()
    assert torch.equal(res_k, all_k[..., t - n_res :, :]) and torch.equal(res_v, all_v[..., t - n_vres :, :])
    k_hat, v_hat = expected_kv(cache, all_k, all_v)
    got_k, got_v = cache.dequantize()
    assert torch.equal(got_k, k_hat) and torch.equal(got_v, v_hat)
    q = tokens(1, seed, heads=H)
    assert torch.equal(cache.attend(q), attention_ref(q, k_hat, v_hat))


@pytest.mark.parametrize("prompt", [1, 31, 32, 33, 160, 300])
def test_online_cache_every_state_matches_the_token_history(prompt):
    cfg = PNMixConfig()
    q, k, v = tokens(prompt, 1, heads=H), tokens(prompt, 2), tokens(prompt, 3)
    cache = ReferenceCache.from_prefill(q, k, v, cfg)
    all_k, all_v = k, v
    check_state(cache, all_k, all_v, 0)
    # Chunks that cross the flush boundaries at 32 + 128 * j several times.
    for step, n in enumerate([1, 5, 97, 1, 128, 64, 200, 3]):
        new_k, new_v = tokens(n, 100 + step), tokens(n, 200 + step)
        cache.append(new_k, new_v)
        all_k, all_v = torch.cat([all_k, new_k], -2), torch.cat([all_v, new_v], -2)
        check_state(cache, all_k, all_v, step)


@pytest.mark.parametrize(
    "cfg",
    [
        PNMixConfig(group_size=16, residual_length=48, n_sink=0, pair_layout="adjacent"),
        PNMixConfig(group_size=8, residual_length=8, n_sink=3, value_bits=16, ratio=0.25),
        PNMixConfig(b_high=4, b_low=2, group_size=8, residual_length=16, value_bits=4, value_group_size=8),
        PNMixConfig(b_high=2, b_low=2, ratio=1.0, group_size=8, residual_length=8, scale_dtype=torch.float32),
        methods.kivi(2, group_size=8, n_sink=2),  # sliding values: one value quantized per step past the window
        PNMixConfig(group_size=8, residual_length=16, n_sink=0, value_residual="sliding", value_group_size=8),
    ],
)
def test_other_configs_every_state(cfg):
    q, k, v = tokens(21, 4, heads=H), tokens(21, 5), tokens(21, 6)
    cache = ReferenceCache.from_prefill(q, k, v, cfg)
    all_k, all_v = k, v
    for step in range(60):
        new_k, new_v = tokens(1, 300 + step), tokens(1, 400 + step)
        cache.append(new_k, new_v)
        all_k, all_v = torch.cat([all_k, new_k], -2), torch.cat([all_v, new_v], -2)
    check_state(cache, all_k, all_v, 7)


def test_any_split_of_appends_gives_the_same_cache():
    k, v = tokens(333, 7), tokens(333, 8)
    q = tokens(40, 9, heads=H)
    one = ReferenceCache.from_prefill(q, k[..., :40, :], v[..., :40, :])
    for i in range(40, 333):
        one.append(k[..., i : i + 1, :], v[..., i : i + 1, :])
    chunked = ReferenceCache.from_prefill(q, k[..., :40, :], v[..., :40, :])
    chunked.append(k[..., 40:300, :], v[..., 40:300, :])
    chunked.append(k[..., 300:, :], v[..., 300:, :])
    for name, t in one.packed().items():
        assert torch.equal(t, chunked.packed()[name]), name
    assert torch.equal(one.dequantize()[0], chunked.dequantize()[0])


def test_mask_is_the_prefill_selection_and_never_changes():
    q, k, v = tokens(50, 10, heads=H), tokens(50, 11), tokens(50, 12)
    cache = ReferenceCache.from_prefill(q, k, v)
    expected = select_salient_pairs(pair_saliency(q, k, "split"), 4)
    assert torch.equal(cache.pair_mask, expected)
    assert torch.equal(cache.channel_mask, channel_mask_from_pairs(expected, "split"))
    mask_bytes = cache.storage().mask
    # Adversarial decode keys: all energy on the pairs prefill found least salient.
    adversarial = torch.zeros(B, H_KV, 300, D, dtype=torch.float16)
    adversarial[..., ~cache.channel_mask[0, 0]] = 100.0
    cache.append(adversarial, adversarial)
    assert torch.equal(cache.pair_mask, expected)
    assert cache.saliency_computations == 1
    assert cache.storage().mask == mask_bytes == B * H_KV * 1


def test_attention_is_causal_for_several_new_queries():
    q, k, v = tokens(40, 13, heads=H), tokens(40, 14), tokens(40, 15)
    cache = ReferenceCache.from_prefill(q, k, v)
    new_q = tokens(3, 16, heads=H)
    k_hat, v_hat = cache.dequantize()
    out = cache.attend(new_q)
    for j in range(3):
        visible = 40 - 3 + j + 1
        ref = attention_ref(new_q[..., j : j + 1, :], k_hat[..., :visible, :], v_hat[..., :visible, :])
        assert torch.equal(out[..., j : j + 1, :], ref)


def test_adjacent_and_split_caches_agree_under_channel_permutation():
    first, second = pair_channels(D, "adjacent")
    perm = torch.cat([first, second])
    q, k, v = tokens(200, 17, heads=H), tokens(200, 18), tokens(200, 19)
    adj = ReferenceCache.from_prefill(q, k, v, PNMixConfig(pair_layout="adjacent"))
    split = ReferenceCache.from_prefill(q[..., perm], k[..., perm], v[..., perm], PNMixConfig(pair_layout="split"))
    assert torch.equal(adj.channel_mask[..., perm], split.channel_mask)
    assert torch.equal(adj.key_codes().codes[..., perm], split.key_codes().codes)
    new_q = tokens(1, 20, heads=H)
    out_adj, out_split = adj.attend(new_q), split.attend(new_q[..., perm])
    torch.testing.assert_close(out_adj[..., perm], out_split, rtol=0, atol=2e-3)


def test_bfloat16_and_float32_inputs():
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = tokens(170, 21, dtype, heads=H), tokens(170, 22, dtype), tokens(170, 23, dtype)
        cache = ReferenceCache.from_prefill(q, k, v)
        assert cache.storage() == storage_model(cache.config, B, H_KV, D, 170, dtype)
        out = cache.attend(q[..., -1:, :])
        assert out.dtype == dtype and out.shape == (B, H, 1, D)


def test_constant_key_groups_reconstruct_exactly():
    k = torch.full((1, 1, 160, 8), -3.25, dtype=torch.float16)
    v = torch.full((1, 1, 160, 8), 0.5, dtype=torch.float16)
    cache = ReferenceCache.from_prefill(torch.ones(1, 2, 160, 8, dtype=torch.float16), k, v)
    k_hat, v_hat = cache.dequantize()
    assert torch.equal(k_hat, k.float()) and torch.equal(v_hat, v.float())
    assert bool((cache.key_codes().scale == 0).all())


@pytest.mark.parametrize(
    "cfg",
    [
        PNMixConfig(group_size=8, residual_length=8, n_sink=3),
        methods.kivi(2, group_size=8, n_sink=2),  # a sliding value window
        methods.kitty(group_size=8, residual_length=16, n_sink=1),  # channels chosen per page
        PNMixConfig(group_size=8, residual_length=16, n_sink=0, value_bits=16, ratio=0.25),
    ],
)
def test_stepwise_attention_over_chunks_equals_token_by_token_decoding(cfg):
    q0, k0, v0 = tokens(13, 30, heads=H), tokens(13, 31), tokens(13, 32)
    k, v, q = tokens(40, 33), tokens(40, 34), tokens(40, 35, heads=H)
    one = ReferenceCache.from_prefill(q0, k0, v0, cfg)
    expected = []
    for j in range(40):
        one.append(k[..., j : j + 1, :], v[..., j : j + 1, :])
        expected.append(one.attend(q[..., j : j + 1, :]))
    expected = torch.cat(expected, -2).float()
    chunked, got = ReferenceCache.from_prefill(q0, k0, v0, cfg), []
    for a in range(0, 40, 16):  # chunks across flushes, of a size that is no multiple of the pages
        res_k, res_v = chunked.residual()
        new_k, new_v = k[..., a : a + 16, :], v[..., a : a + 16, :]
        chunked.append(new_k, new_v)
        got.append(
            chunked.attend_stepwise(q[..., a : a + 16, :], torch.cat([res_k, new_k], -2), torch.cat([res_v, new_v], -2))
        )
    got = torch.cat(got, -2).float()
    # Equal up to the float16 rounding of the output (the float32 sums run in another order).
    assert bool(((got - expected).abs() <= torch.finfo(torch.float16).eps * expected.abs().clamp_min(2**-14)).all())
    assert not torch.equal(got, chunked.attend(q[..., -40:, :]).float()), "plain chunked attention is not stepwise"
    with pytest.raises(ValueError, match="does not reach back to position"):
        chunked.attend_stepwise(q[..., -8:, :], k[..., -1:, :], v[..., -1:, :])


def test_the_value_checks_of_a_call_torch_compile_traces_are_deferred_to_check():
    """A traced call cannot read its inputs back without breaking the graph: their checks run on the device, and
    check() (which every call outside compiled code runs first) names the bad argument; the cache, which stored
    it, then refuses further use."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=gen) for _ in range(3))
    cache = ReferenceCache.from_prefill(q, k, v, PNMixConfig(group_size=8, residual_length=8, n_sink=2))
    fine, bad = torch.randn(1, 2, 1, 16, generator=gen), torch.randn(1, 2, 1, 16, generator=gen)
    bad[0, 1, 0, 3] = float("nan")
    torch._dynamo.reset()
    append = torch.compile(cache.append, fullgraph=True, backend="eager")
    append(fine, fine)  # 7 of the residual's 8: no page flushes in these calls (a flush breaks the graph, once a page)
    cache.check()  # nothing wrong so far
    cache = ReferenceCache.from_prefill(q, k, v, PNMixConfig(group_size=8, residual_length=8, n_sink=2))
    torch._dynamo.reset()
    append = torch.compile(cache.append, fullgraph=True, backend="eager")
    append(fine, bad)
    assert cache.length == 17  # stored: the check was deferred
    with pytest.raises(ValueError, match=r"^v contains NaN or Inf \(given to append since prefill"):
        cache.check()
    with pytest.raises(ValueError, match="refuses further use"):
        cache.attend(q[..., -1:, :])
    eager = ReferenceCache.from_prefill(q, k, v, PNMixConfig(group_size=8, residual_length=8, n_sink=2))
    with pytest.raises(ValueError, match="v contains NaN or Inf"):  # outside compiled code: refused before storing
        eager.append(fine, bad)
    assert eager.length == 16
