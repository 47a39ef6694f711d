"""Property 6: which newest tokens stay exact, and when they are quantized, follow the residual
policy the implementation claims (`reference.contract.RESIDUAL_POLICIES`, `reference.exact_tail`),
and any split of the appends (one token at a time or several at once) gives the same cache."""

import pytest
import torch
from hypothesis import example, given, settings

from conformance import strategies as cs
from conformance.harness import bits_of, fitted, states
from reference import PNMixConfig, exact_tail

N2G = PNMixConfig(group_size=8, residual_length=16, n_sink=3)


@given(case=cs.cases())
@example(case=cs.Case(N2G, 1, 1, 2, 8, torch.float16, 1, (1,) * 20 + (15, 16, 17), 1))
@example(case=cs.Case(N2G, 2, 2, 1, 16, torch.float16, 19, (16, 32, 1), 2))
@example(case=cs.Case(N2G, 1, 3, 1, 8, torch.bfloat16, 18, (), 3))
def test_residual_holds_the_newest_tokens_and_flushes_at_n(impl, device, case):
    case = fitted(impl, case, device)
    policy = impl.capabilities.residual
    for state in states(impl, case, device):
        n_k, n_v = exact_tail(case.config, state.calls, policy)
        assert state.cache.length == state.length
        res_k, res_v = state.cache.residual()
        where = f"step {state.step} ({state.length} tokens, {policy} residual)"
        assert res_k.shape[-2] == n_k, f"{where}: {n_k} exact newest keys expected, got {res_k.shape[-2]}"
        assert res_v.shape[-2] == n_v, f"{where}: {n_v} exact newest values expected, got {res_v.shape[-2]}"
        k_hat, v_hat = state.cache.dequantize()
        assert k_hat.shape[-2] == v_hat.shape[-2] == state.length, f"{where}: dequantize() holds the wrong length"
        for got, every, n, what in ((res_k, state.all_k, n_k, "keys"), (res_v, state.all_v, n_v, "values")):
            newest = every[..., state.length - n :, :]
            assert torch.equal(bits_of(got.cpu()), bits_of(newest)), f"{where}: residual {what} are not the newest"


# Half the profile's examples: one token at a time, each case makes up to a hundred appends.
@settings(max_examples=max(2, settings().max_examples // 2))
@given(case=cs.cases(max_appends=3))
@example(case=cs.Case(N2G, 1, 1, 1, 8, torch.float16, 4, (40,), 4))
def test_any_split_of_appends_gives_the_same_cache(impl, device, case):
    if impl.capabilities.residual == "requantize":
        pytest.skip(f"{impl.name} re-quantizes when its residual fills: its cache depends on the split by design")
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
    for what, a, b in zip(("keys", "values"), chunked.dequantize(), one_by_one.dequantize(), strict=True):
        assert torch.equal(bits_of(a), bits_of(b)), f"dequantized {what} depend on how the appends were split"
    for what, a, b in zip(("keys", "values"), chunked.residual(), one_by_one.residual(), strict=True):
        assert torch.equal(bits_of(a), bits_of(b)), f"residual {what} depend on how the appends were split"
