"""Property 6: which tokens sit in the exact residual, and when it flushes, match the
reference for any split of the appends (one token at a time or several at once)."""

import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import bits_of, fitted, states
from reference import PNMixConfig, token_layout

N2G = PNMixConfig(group_size=8, residual_length=16, n_sink=3)


@given(case=cs.cases())
@example(case=cs.Case(N2G, 1, 1, 2, 8, torch.float16, 1, (1,) * 20 + (15, 16, 17), 1))
@example(case=cs.Case(N2G, 2, 2, 1, 16, torch.float16, 19, (16, 32, 1), 2))
@example(case=cs.Case(N2G, 1, 3, 1, 8, torch.bfloat16, 18, (), 3))
def test_residual_holds_the_newest_tokens_and_flushes_at_n(impl, device, case):
    case = fitted(impl, case, device)
    for state in states(impl, case, device):
        _, n_q, n_res = token_layout(case.config, state.length)
        assert state.cache.length == state.length
        res_k, res_v = state.cache.residual()
        assert res_k.shape[-2] == n_res, f"step {state.step}: {n_res} residual tokens expected, got {res_k.shape[-2]}"
        start = state.length - n_res
        assert torch.equal(bits_of(res_k.cpu()), bits_of(state.all_k[..., start:, :])), "residual keys"
        assert torch.equal(bits_of(res_v.cpu()), bits_of(state.all_v[..., start:, :])), "residual values"
        assert state.cache.key_codes().codes.shape[-2] == n_q, f"step {state.step}: {n_q} quantized tokens expected"


@given(case=cs.cases(max_appends=3))
@example(case=cs.Case(N2G, 1, 1, 1, 8, torch.float16, 4, (40,), 4))
def test_any_split_of_appends_gives_the_same_cache(impl, device, case):
    case = fitted(impl, case, device)
    q, k, v = cs.prefill_tensors(case, device)
    chunked, one_by_one = impl.create(case.config), impl.create(case.config)
    chunked.prefill(q, k, v)
    one_by_one.prefill(q, k, v)
    for i in range(len(case.appends)):
        new_k, new_v = cs.append_tensors(case, i, device)
        chunked.append(new_k, new_v)
        for t in range(new_k.shape[-2]):
            one_by_one.append(new_k[..., t : t + 1, :], new_v[..., t : t + 1, :])
    a, b = chunked.key_codes(), one_by_one.key_codes()
    assert torch.equal(a.codes, b.codes) and torch.equal(bits_of(a.scale), bits_of(b.scale))
    assert torch.equal(bits_of(chunked.residual()[0]), bits_of(one_by_one.residual()[0]))
    assert torch.equal(bits_of(chunked.dequantize()[1]), bits_of(one_by_one.dequantize()[1]))
