"""Property 12 (optional methods): where an implementation's caches have the evaluation path's optional
methods (`reference.contract.Cache`: `checkpoint` / `roll_back` / `release`, `attend_stepwise`,
`select_rows`), they do what `pnmix.hf.PNMixHFCache` relies on: a checkpoint is returned to, bit for bit,
any number of times; stepwise attention over a chunk appended at once gives each token what it would have
read appended alone, within property 7's rule; selected batch rows hold, bit for bit, what a cache of
those rows alone holds (beam search). Caches without them are skipped, saying so (the evaluation path then
runs the context again for each continuation, and one token a forward; beam search is refused)."""

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from conformance import strategies as cs
from conformance.harness import assert_unchanged, changed, fitted, observe
from reference import PNMixConfig, attention_ref
from reference.channels.stepwise import stepwise_attention
from reference.contract.tolerances import attention_bound

CFG = PNMixConfig(group_size=8, residual_length=8, n_sink=2)
CHECKPOINTS = ("checkpoint", "roll_back", "release")


def _lacks(cache, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if not callable(getattr(cache, n, None))]


@settings(max_examples=max(2, settings().max_examples // 2))
@given(case=cs.cases(max_appends=3))
@example(case=cs.Case(CFG, 1, 2, 2, 16, torch.float16, 12, (20, 1), 5))
def test_a_checkpoint_is_returned_to_any_number_of_times(impl, device, case):
    case = fitted(impl, case, device)
    cache = impl.create(case.config)
    if missing := _lacks(cache, CHECKPOINTS):
        pytest.skip(f"{impl.name} does not claim the optional {', '.join(missing)} (its caches have none)")
    cache.prefill(*cs.prefill_tensors(case, device))
    before, saved, after = observe(cache, impl), cache.checkpoint(), []
    for _ in range(2):
        for i in range(len(case.appends)):
            cache.append(*cs.append_tensors(case, i, device))
        after.append(observe(cache, impl))
        cache.roll_back(saved)
        assert_unchanged(before, observe(cache, impl), "rolling back to a checkpoint did not restore the cache's")
    assert not changed(after[0], after[1]), f"the same appends after a roll back changed {changed(after[0], after[1])}"
    cache.release(saved)


@settings(max_examples=max(2, settings().max_examples // 2))
@given(case=cs.cases(max_appends=2))
@example(case=cs.Case(CFG, 1, 2, 2, 16, torch.float16, 12, (3, 19), 6))
def test_stepwise_attention_is_what_each_token_would_have_read(impl, device, case):
    if impl.capabilities.residual == "requantize":
        pytest.skip(f"{impl.name} re-quantizes when its residual fills: its cache depends on the split by design")
    case = fitted(impl, case, device)
    assume(case.appends)
    chunked, one = impl.create(case.config), impl.create(case.config)
    if missing := _lacks(chunked, ("attend_stepwise",)):
        pytest.skip(f"{impl.name} does not claim the optional {', '.join(missing)} (its caches have none)")
    q, k, v = cs.prefill_tensors(case, device)
    chunked.prefill(q, k, v)
    one.prefill(q, k, v)
    for i in range(len(case.appends) - 1):
        for cache in (chunked, one):
            cache.append(*cs.append_tensors(case, i, device))
    new_k, new_v = cs.append_tensors(case, len(case.appends) - 1, device)
    res_k, res_v = chunked.residual()  # the exact tokens before the chunk, then the chunk itself
    chunked.append(new_k, new_v)
    n = new_k.shape[2]
    queries = cs.decode_queries(case, n, device)
    tail_k, tail_v = torch.cat([res_k, new_k], 2), torch.cat([res_v, new_v], 2)
    got = chunked.attend_stepwise(queries, tail_k, tail_v)
    assert got.shape == queries.shape and got.dtype == queries.dtype, f"{tuple(got.shape)} {got.dtype}"
    # the spec's computation of the same rule over the implementation's own codes, in its dtype: the
    # error it makes is the measure of what this dtype allows (property 7's policy)
    k_all, v_all = (t.cpu() for t in chunked.dequantize())
    spec = stepwise_attention(case.config, queries.cpu(), k_all, v_all, tail_k.cpu(), tail_v.cpu())
    for j in range(n):
        one.append(new_k[..., j : j + 1, :], new_v[..., j : j + 1, :])
        k_hat, v_hat = (t.cpu().double() for t in one.dequantize())
        q_j = queries[..., j : j + 1, :].cpu()
        oracle = attention_ref(q_j.double(), k_hat, v_hat, causal=True, upcast=False)
        err = (got[..., j : j + 1, :].cpu().double() - oracle).abs().max().item()
        bound = attention_bound(oracle, spec[..., j : j + 1, :], q_j.dtype)
        assert err <= bound, f"token {j + 1} of {n}: error {err:.3g} against what it would have read, bound {bound:.3g}"


@settings(max_examples=max(2, settings().max_examples // 2))
@given(case=cs.cases(max_appends=2), drawn=st.lists(st.integers(0, 63), min_size=1, max_size=4))
@example(case=cs.Case(CFG, 3, 2, 2, 16, torch.float16, 20, (9,), 8), drawn=[2, 0, 2]).via("beam search's reorder")
def test_selected_rows_hold_what_a_cache_of_those_rows_alone_holds(impl, device, case, drawn):
    case = fitted(impl, case, device)
    selected = impl.create(case.config)
    if missing := _lacks(selected, ("select_rows",)):
        pytest.skip(f"{impl.name} does not claim the optional {', '.join(missing)} (its caches have none)")
    rows = [r % case.batch for r in drawn]  # rows may repeat (beams of one sequence)
    index = torch.tensor(rows, device=device)
    q, k, v = cs.prefill_tensors(case, device)
    selected.prefill(q, k, v)
    alone = impl.create(case.config)
    alone.prefill(q[index], k[index], v[index])
    for i in range(len(case.appends)):
        new_k, new_v = cs.append_tensors(case, i, device)
        selected.append(new_k, new_v)
        alone.append(new_k[index], new_v[index])
    selected.select_rows(index)
    differ = changed(observe(alone, impl), observe(selected, impl))
    assert not differ, f"rows {rows} selected differ from a cache of those rows alone in its {differ[0]}"
