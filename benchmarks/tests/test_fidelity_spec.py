"""The fidelity analyses build their keys with the spec and pair channels by the configured layout.

No model is needed: synthetic post-RoPE traces with awkward sizes stand in for the real ones.
"""

import dataclasses
import math

import pytest
import torch

from benchmarks.fidelity import analyses as fidelity
from reference import PNMixConfig, ReferenceCache
from reference.channels.selection import PAGE_CHANNELS
from reference.equations import quant
from reference.equations.polar import polar_dequantize, polar_quantize
from reference.equations.saliency import CRITERIA, channel_mask_from_pairs, criterion_scores, select_salient_pairs
from reference.methods import METHODS

PAGES = {"group_size": 8, "residual_length": 16, "n_sink": 3}


def trace(n_heads: int, kv_heads: int, length: int, head_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [H, T, d] and k [H_kv, T, d] with channels of unequal scale, so that selections matter."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_heads, length, head_dim, generator=g) * (1 + 3 * torch.rand(head_dim, generator=g))
    k = torch.randn(kv_heads, length, head_dim, generator=g) * (1 + 3 * torch.rand(head_dim, generator=g))
    return q, k


def spec_cache_keys(q, k, prompt_len, config):
    """What the spec's cache holds after prefill of the prompt and one append per generated token."""
    v = torch.zeros_like(k)[None]
    cache = ReferenceCache.from_prefill(q[None, :, :prompt_len], k[None, :, :prompt_len], v[:, :, :prompt_len], config)
    for t in range(prompt_len, k.shape[1]):
        cache.append(k[None, :, t : t + 1], v[:, :, t : t + 1])
    return cache.dequantize()[0][0], cache


def quantized_span(config, length):
    n_sink = min(length, config.n_sink)
    n_q = (length - n_sink) // config.residual_length * config.residual_length
    return n_sink, n_sink + n_q


@pytest.mark.parametrize("layout", ["split", "adjacent"])
@pytest.mark.parametrize(
    ("n_heads", "kv_heads", "length", "head_dim", "prompt_len"), [(6, 2, 54, 16, 21), (3, 3, 97, 8, 40)]
)
def test_table9_keys_are_the_spec_caches_and_quantizers(layout, n_heads, kv_heads, length, head_dim, prompt_len):
    q, k = trace(n_heads, kv_heads, length, head_dim, seed=length)
    base = PNMixConfig(pair_layout=layout, **PAGES)
    got = fidelity.table9_keys(q, k, prompt_len, base)
    assert len(got) == 2 + 2 * len(CRITERIA)
    lo, hi = quantized_span(base, length)
    region = k[None, :, lo:hi]
    g = base.group_size

    kivi = METHODS["KIVI-2"](pair_layout=layout, **PAGES)
    assert torch.equal(got["KIVI-style uniform 2-bit"], spec_cache_keys(q, k, prompt_len, kivi)[0])
    polar = k.clone()
    polar[:, lo:hi] = polar_dequantize(polar_quantize(region, 2, g, layout), g, layout)[0]
    assert torch.equal(got["PolarQuant-style 2-bit"], polar)

    for crit in CRITERIA:
        config = dataclasses.replace(base, criterion=crit)
        expected, cache = spec_cache_keys(q, k, prompt_len, config)
        assert torch.equal(got[f"H3(50%)L1, {crit} (prefill)"], expected), crit
        # the same keys through quantize_keys with the mask the cache chose at prefill
        assert torch.equal(fidelity.masked_keys(k, config, cache.channel_mask[0]), expected), crit

        scores = criterion_scores(crit, q[None], k[None], layout)[0]
        mask = channel_mask_from_pairs(select_salient_pairs(scores, head_dim // 4), layout)
        full = k.clone()
        codes = quant.quantize_keys(region, mask[None], 3, 1, g)
        full[:, lo:hi] = quant.dequantize(codes, g, -2)[0]
        assert torch.equal(got[f"H3(50%)L1, {crit} (full)"], full), crit

    for name, k_hat in got.items():  # sinks and residual exact, the quantized region not
        assert torch.equal(k_hat[:, :lo], k[:, :lo]) and torch.equal(k_hat[:, hi:], k[:, hi:]), name
        assert not torch.equal(k_hat[:, lo:hi], k[:, lo:hi]), name


def test_kitty_per_page_selection_is_available():
    """Kitty's cache picks each page's 4-bit channels from that page's own keys; cache_keys keeps it."""
    kv_heads, length, head_dim, prompt_len = 2, 3 + 3 * 16 + 5, 16, 20
    q, _ = trace(4, kv_heads, length, head_dim, seed=7)
    k = 0.1 * torch.randn(kv_heads, length, head_dim, generator=torch.Generator().manual_seed(8))
    g = 8
    n_pages = 3 * 16 // g
    boosted = torch.zeros(kv_heads, n_pages, head_dim, dtype=torch.bool)
    for h in range(kv_heads):
        for p in range(n_pages):
            chans = torch.randperm(head_dim, generator=torch.Generator().manual_seed(10 * h + p))[: head_dim // 4]
            boosted[h, p, chans] = True
            k[h, 3 + p * g : 3 + (p + 1) * g, chans] *= 20  # this page's channels stand out
    config = METHODS["Kitty"](**PAGES)
    assert config.b_high == 4 and config.b_low == 2 and config.selector is PAGE_CHANNELS
    got = fidelity.cache_keys(q, k, prompt_len, config)
    assert torch.equal(got, spec_cache_keys(q, k, prompt_len, dataclasses.replace(config, value_bits=16))[0])
    assert torch.equal(got, fidelity.masked_keys(k, config, boosted))
    assert not torch.equal(got, fidelity.masked_keys(k, config, boosted[:, 0]))  # one mask for every page differs


def adjacent_vs_split_keys(seed: int = 0, length: int = 64) -> torch.Tensor:
    """d = 8 keys: channels 0 and 1 large, 2 medium, the rest small. Top 2 of 4 pairs:
    adjacent (0,1), (2,3) -> channels 0-3; split (0,4), (1,5) -> channels 0, 1, 4, 5."""
    scale = torch.tensor([10.0, 10.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    return torch.randn(1, length, 8, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize(
    ("layout", "channels"), [("adjacent", [1, 1, 1, 1, 0, 0, 0, 0]), ("split", [1, 1, 0, 0, 1, 1, 0, 0])]
)
def test_selections_pair_channels_by_layout(layout, channels):
    k = adjacent_vs_split_keys()
    q = torch.ones(2, k.shape[1], 8)  # equal query pair norms: QK pair norm ranks as K pair norm
    base = PNMixConfig(pair_layout=layout, **PAGES)
    expected = torch.tensor([channels], dtype=torch.bool)
    got = fidelity.table9_keys(q, k, 40, base)
    for crit in ("qk-pair-norm", "k-pair-norm"):
        for scope in ("prefill", "full"):
            config = dataclasses.replace(base, criterion=crit)
            assert torch.equal(got[f"H3(50%)L1, {crit} ({scope})"], fidelity.masked_keys(k, config, expected))
    other = dataclasses.replace(base, pair_layout="split" if layout == "adjacent" else "adjacent")
    flipped = fidelity.table9_keys(q, k, 40, other)
    assert not torch.equal(got["H3(50%)L1, k-pair-norm (full)"], flipped["H3(50%)L1, k-pair-norm (full)"])


def brute_importance(q, k, start, key_from, layout, dot: bool, stop=None):
    """The Fig. 5 / Table 11 sums by explicit loops, pair i = (2i, 2i+1) or (i, i + d/2)."""
    n_heads, length, d = q.shape
    n_rep = n_heads // k.shape[0]
    pairs = [(2 * i, 2 * i + 1) if layout == "adjacent" else (i, i + d // 2) for i in range(d // 2)]
    out = torch.zeros(k.shape[0], d // 2, dtype=torch.float64)
    qd, kd = q.double(), k.double()
    for h in range(n_heads):
        for t in range(start, stop or length):
            for s in range(key_from, t + 1):
                for i, (a, b) in enumerate(pairs):
                    qa, qb, ka, kb = qd[h, t, a], qd[h, t, b], kd[h // n_rep, s, a], kd[h // n_rep, s, b]
                    if dot:
                        out[h // n_rep, i] += abs(qa * ka + qb * kb)
                    else:
                        out[h // n_rep, i] += math.hypot(qa, qb) * math.hypot(ka, kb)
    return out


@pytest.mark.parametrize("layout", ["split", "adjacent"])
def test_decode_and_dot_importance_follow_the_layout(layout):
    q, k = trace(4, 2, 13, 8, seed=3)
    got = fidelity.decode_importance(q, k, 6, layout, key_from=2)
    torch.testing.assert_close(got.double(), brute_importance(q, k, 6, 2, layout, dot=False), rtol=1e-5, atol=1e-4)
    got = fidelity.dot_importance(q, k, 7, 11, 5, layout)
    expected = brute_importance(q, k, 7, 5, layout, dot=True, stop=11)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)


def test_importance_of_channels_0_and_1_lands_in_one_pair_only_when_adjacent():
    q = torch.zeros(2, 5, 8)
    k = torch.zeros(1, 5, 8)
    q[..., :2], k[..., :2] = 1.0, 2.0
    for fn in (
        lambda lay: fidelity.decode_importance(q, k, 2, lay),
        lambda lay: fidelity.dot_importance(q, k, 2, 5, 0, lay),
    ):
        assert fn("adjacent")[0].nonzero().flatten().tolist() == [0]
        assert fn("split")[0].nonzero().flatten().tolist() == [0, 1]


@pytest.mark.parametrize(("n_heads", "kv_heads", "length", "start"), [(6, 2, 17, 9), (4, 4, 12, 0), (3, 1, 10, 9)])
def test_attention_kl_matches_a_direct_softmax(n_heads, kv_heads, length, start):
    q, k = trace(n_heads, kv_heads, length, 8, seed=start)
    k_hat = k + 0.3 * torch.randn(k.shape, generator=torch.Generator().manual_seed(1))
    n_rep = n_heads // kv_heads
    kls = []
    for h in range(n_heads):
        for t in range(start, length):
            logits = [keys[h // n_rep, : t + 1].double() @ q[h, t].double() / math.sqrt(8) for keys in (k, k_hat)]
            p, p_hat = torch.softmax(logits[0], 0), torch.softmax(logits[1], 0)
            kls.append(float((p * (p / p_hat).log()).sum()))
    assert fidelity.attention_kl(q, k, k_hat, start) == pytest.approx(sum(kls) / len(kls), rel=1e-4, abs=1e-7)
    assert fidelity.attention_kl(q, k, k, start) == 0.0
