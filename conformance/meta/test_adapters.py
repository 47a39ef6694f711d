"""The built-in adapters of libraries attend with the library's own arithmetic, or say they do not."""

from unittest import mock

import pytest
import torch

from conformance import loader
from conformance import strategies as cs
from reference import PNMixConfig
from reference.contract import ATTENTION

pytest.importorskip("optimum.quanto")


def test_every_builtin_states_whose_attention_it_runs():
    for name in loader.builtins():
        assert loader.load(name).capabilities.attention in ATTENTION


@pytest.mark.parametrize("new", [1, 3])
def test_the_transformers_adapter_attends_as_transformers_sdpa_does(new):
    """Its `attend` is torch SDPA in float16 over the states `update` returns, causal from the bottom
    right (what transformers' "sdpa" attention computes in a model), not the spec's float32 attention."""
    impl = loader.load("transformers-quanto")
    assert impl.capabilities.attention == "own"
    case = cs.Case(
        PNMixConfig(b_high=4, b_low=4, value_bits=4, group_size=8, residual_length=8, n_sink=0),
        1,
        2,
        2,
        16,
        torch.float16,
        40,
        (3,),
        5,
        "wide_range",
    ).fit(impl.capabilities)
    q, k, v = cs.prefill_tensors(case, "cpu")
    cache = impl.create(case.config)
    cache.prefill(q, k, v)
    cache.append(*cs.append_tensors(case, 0, "cpu"))
    query = cs.decode_queries(case, new, "cpu")
    k_states, v_states = (t.to(torch.float16) for t in cache.dequantize())
    length = k_states.shape[-2]
    mask = torch.arange(length) <= torch.arange(length - new, length).unsqueeze(-1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        query, k_states.repeat_interleave(2, 1), v_states.repeat_interleave(2, 1), attn_mask=mask
    )
    sdpa_function = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=sdpa_function) as spy:
        got = cache.attend(query)
    assert torch.equal(got, sdpa)
    # through transformers' SDPA path, on the states in their own dtype (on the CPU torch's SDPA then
    # rounds as the spec does; on a GPU its fused kernels do not)
    ((q_in, k_in, v_in), _), *others = spy.call_args_list
    assert not others and q_in.dtype == k_in.dtype == v_in.dtype == torch.float16
