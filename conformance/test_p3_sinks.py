"""Property 3: the first n_sink tokens' keys and values come back bit-identical, through
prefill and any sequence of appends and flushes, whatever the prompt length."""

import dataclasses

import pytest
import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import bits_of, fitted, states
from reference import PNMixConfig

SINK32 = PNMixConfig(group_size=8, residual_length=16, n_sink=32)


@given(case=cs.cases(kinds=cs.KINDS), n_sink=cs.st.sampled_from([1, 3, 8, 32]))
@example(case=cs.Case(SINK32, 1, 2, 2, 16, torch.float16, 31, (1, 1, 20), 1, "signed_zeros"), n_sink=32)
@example(case=cs.Case(SINK32, 2, 1, 3, 8, torch.float16, 32, (16, 17), 2, "subnormal"), n_sink=32)
@example(case=cs.Case(SINK32, 1, 1, 1, 8, torch.bfloat16, 33, (40,), 3, "extremes"), n_sink=32)
@example(case=cs.Case(SINK32, 3, 2, 1, 12, torch.float32, 1, (1,) * 40, 5, "wide_range"), n_sink=32)
def test_sink_tokens_are_bit_identical(impl, device, case, n_sink):
    if not impl.capabilities.sinks:
        pytest.skip(f"{impl.name} does not claim sink tokens")
    case = fitted(impl, dataclasses.replace(case, config=dataclasses.replace(case.config, n_sink=n_sink)), device)
    for state in states(impl, case, device):
        n = min(state.length, case.config.n_sink)  # the method may keep more exact (FP16: every token)
        sink_k, sink_v = state.cache.sinks()
        assert sink_k.shape[-2] == n and sink_v.shape[-2] == n, f"step {state.step}: {n} sinks expected"
        assert torch.equal(bits_of(sink_k.cpu()), bits_of(state.all_k[..., :n, :])), f"sink keys, step {state.step}"
        assert torch.equal(bits_of(sink_v.cpu()), bits_of(state.all_v[..., :n, :])), f"sink values, step {state.step}"
        k_hat, v_hat = state.cache.dequantize()
        expected_k, expected_v = state.all_k[..., :n, :].float(), state.all_v[..., :n, :].float()
        assert torch.equal(bits_of(k_hat.cpu()[..., :n, :]), bits_of(expected_k)), "dequantized sink keys"
        assert torch.equal(bits_of(v_hat.cpu()[..., :n, :]), bits_of(expected_v)), "dequantized sink values"
