"""The oracle's scores: q k^T / sqrt(d) with GQA head h -> h // n_rep, bottom-right causal, and
attention_ref is their softmax times v."""

import math

import pytest
import torch

from reference import attention_ref
from reference.equations.attention import attention_logits_ref, saturating_cast


@pytest.mark.parametrize(("heads", "kv_heads", "t_q", "t_k"), [(6, 2, 5, 17), (3, 3, 1, 12), (4, 1, 9, 9)])
def test_logits_are_scaled_dot_products_with_the_gqa_map_and_causal_mask(heads, kv_heads, t_q, t_k):
    g = torch.Generator().manual_seed(t_k)
    q, k = torch.randn(2, heads, t_q, 10, generator=g), torch.randn(2, kv_heads, t_k, 10, generator=g)
    logits = attention_logits_ref(q, k, causal=True)
    assert logits.shape == (2, heads, t_q, t_k) and logits.dtype == torch.float32
    n_rep = heads // kv_heads
    for b in range(2):
        for h in range(heads):
            for j in range(t_q):
                for s in range(t_k):
                    if s > t_k - t_q + j:
                        assert logits[b, h, j, s] == float("-inf")
                    else:
                        direct = float(q[b, h, j].double() @ k[b, h // n_rep, s].double()) / math.sqrt(10)
                        assert float(logits[b, h, j, s]) == pytest.approx(direct, rel=1e-5, abs=1e-5)
    assert torch.isfinite(attention_logits_ref(q, k, causal=False)).all()
    torch.testing.assert_close(attention_logits_ref(q, k, scale=1.0), attention_logits_ref(q, k) * math.sqrt(10))


def test_attention_ref_is_the_softmax_of_the_logits_times_v():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 4, 3, 8, generator=g),
        torch.randn(1, 2, 11, 8, generator=g),
        torch.randn(1, 2, 11, 8, generator=g),
    )
    probs = torch.softmax(attention_logits_ref(q, k, causal=True), -1)
    assert torch.equal(attention_ref(q, k, v, causal=True), probs @ v.repeat_interleave(2, dim=1))
    low = attention_logits_ref(q.half(), k.half(), upcast=False)
    assert low.dtype == torch.float16


@pytest.mark.parametrize(("t_q", "t_k", "window"), [(5, 9, 3), (1, 12, 4), (6, 6, 1), (4, 7, 50)])
def test_a_window_shows_each_query_only_the_last_window_positions_up_to_its_own(t_q, t_k, window):
    g = torch.Generator().manual_seed(window)
    q, k = torch.randn(1, 4, t_q, 8, generator=g), torch.randn(1, 2, t_k, 8, generator=g)
    windowed, causal = attention_logits_ref(q, k, causal=True, window=window), attention_logits_ref(q, k, causal=True)
    for j in range(t_q):
        position = t_k - t_q + j
        seen = torch.isfinite(windowed[0, 0, j]).nonzero().flatten().tolist()
        assert seen == list(range(max(0, position - window + 1), position + 1))
        torch.testing.assert_close(windowed[..., j, seen], causal[..., j, seen], rtol=0, atol=0)
    with pytest.raises(ValueError, match="window must be a positive token count with causal=True"):
        attention_logits_ref(q, k, window=3)
    with pytest.raises(ValueError, match="window"):
        attention_ref(q, k, k, causal=True, window=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_output_saturates_at_the_dtypes_edge_and_keeps_inf_and_nan(dtype):
    big = torch.finfo(dtype).max
    x = torch.tensor([big * 1.001, -big * 1.001, 1.5, float("inf"), float("-inf"), float("nan")])
    got = saturating_cast(x, dtype)
    assert got.dtype == dtype
    assert got[:3].tolist() == [big, -big, 1.5] and got[3:5].tolist() == [float("inf"), float("-inf")]
    assert got[5].isnan()
    # A key and a value of 65504 with a float16 scale rounded up reconstruct to 65536: the output stays finite.
    q, k, v = torch.ones(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), torch.full((1, 1, 1, 2), 65536.0)
    assert attention_ref(q.half(), k, v).tolist() == [[[[65504.0, 65504.0]]]]
