"""Property 7: decode attention against the float64 oracle over the reference's dequantized
cache. The implementation's error may be at most a small multiple of the error the reference
makes computing the same attention in the implementation's dtype, plus output rounding."""

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from conformance import strategies as cs
from conformance.harness import final_state, fitted
from reference import PNMixConfig, attention_ref
from reference.tolerances import attention_bound

CFG = PNMixConfig(group_size=8, residual_length=16, n_sink=4)


@given(case=cs.cases(), n_queries=st.integers(1, 3))
@example(case=cs.Case(CFG, 3, 2, 8, 16, torch.float16, 54, (1, 17), 1), n_queries=1)
@example(case=cs.Case(CFG, 2, 1, 7, 24, torch.bfloat16, 97, (), 2), n_queries=2)
@example(case=cs.Case(CFG, 1, 3, 1, 8, torch.float32, 12, (12,), 3, "wide_range"), n_queries=3)
def test_decode_attention_within_the_low_precision_error(impl, device, case, n_queries):
    case = fitted(impl, case, device)
    state = final_state(impl, case, device)
    q = cs.decode_queries(case, min(n_queries, state.length), device)
    out = state.cache.attend(q)
    assert out.shape == q.shape and out.dtype == q.dtype, f"attend returned {tuple(out.shape)} {out.dtype}"
    k_hat, v_hat = state.ref.dequantize()
    q = q.cpu()
    oracle = attention_ref(q.double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = attention_ref(q, k_hat.to(q.dtype), v_hat.to(q.dtype), causal=True, upcast=False)
    assert bool(torch.isfinite(low).all()), "strategy error: these inputs overflow attention in the dtype"
    err = (out.cpu().double() - oracle).abs()
    bound = attention_bound(oracle, low, q.dtype)
    ref_err = (low.double() - oracle).abs()
    print(f"max err {err.max():.3g} (mean {err.mean():.3g}); reference in {q.dtype}: max {ref_err.max():.3g}")
    assert err.max().item() <= bound, f"attention error {err.max().item():.3g} above {bound:.3g}"
