"""Property 9: each documented bad input raises the documented error, naming the argument,
and a rejected call leaves the cache exactly as it was; so does editing any tensor the cache
returned (what it returns is the caller's)."""

import pytest
import torch
from hypothesis import example, given, settings

from conformance import strategies as cs
from conformance.harness import assert_unchanged, changed, final_state, fitted, observe
from reference import PNMixConfig

CFG = PNMixConfig(group_size=8, residual_length=8, n_sink=2)
#: Every bad input kind is its own test (a draw among them could leave some untried); each
#: takes a share of the profile's examples, since the rejection, not the state, is under test.
PER_KIND = settings(max_examples=max(2, settings().max_examples // 4))


def kinds(bad_inputs):
    return pytest.mark.parametrize("bad", bad_inputs, ids=[what for what, _, _ in bad_inputs])


def bad_append(what, k, v):
    if what == "nan_in_k":
        return k.clone().index_fill_(2, torch.tensor([0], device=k.device), float("nan")), v
    if what == "inf_in_v":
        return k, v.clone().index_fill_(2, torch.tensor([0], device=v.device), float("inf"))
    if what == "wrong_kv_heads":
        return torch.cat([k, k], 1), torch.cat([v, v], 1)
    if what == "wrong_batch":
        return torch.cat([k, k], 0), torch.cat([v, v], 0)
    if what == "wrong_head_dim":
        return k[..., :-2], v[..., :-2]
    if what == "wrong_dtype":
        other = torch.float32 if k.dtype != torch.float32 else torch.float16
        return k.to(other), v.to(other)
    if what == "k_v_mismatch":
        return k, torch.cat([v, v], 2)
    if what == "no_tokens":
        return k[..., :0, :], v[..., :0, :]
    if what == "not_a_tensor":
        return k.tolist(), v
    raise AssertionError(what)


def bad_prefill(what, q, k, v):
    if what == "odd_head_dim":
        return q[..., :-1], k[..., :-1], v[..., :-1]
    if what == "heads_not_multiple":  # 3 query heads over 2 KV heads
        return torch.cat([q[:, :1]] * 3, 1), torch.cat([k[:, :1]] * 2, 1), torch.cat([v[:, :1]] * 2, 1)
    if what == "nan_in_q":
        return q.clone().fill_(float("nan")), k, v
    if what == "float64":
        return q.double(), k.double(), v.double()
    if what == "batch_mismatch":
        return torch.cat([q, q], 0), k, v
    if what == "length_mismatch":
        return torch.cat([q, q], 2), k, v
    if what == "empty_batch":
        return q[:0], k[:0], v[:0]
    if what == "no_kv_heads":
        return q[:, :0], k[:, :0], v[:, :0]
    if what == "no_query_heads":  # keys and values as they are: no query to choose the salient pairs from
        return q[:, :0], k, v
    raise AssertionError(what)


def bad_query(what, q, length):
    if what == "too_many_queries":
        return torch.cat([q] * (length // q.shape[2] + 1), 2)
    if what == "nan_in_q":
        return q.clone().fill_(float("nan"))
    if what == "wrong_head_dim":
        return q[..., :-2]
    if what == "wrong_dtype":
        return q.to(torch.float32 if q.dtype != torch.float32 else torch.float16)
    raise AssertionError(what)


@kinds(cs.BAD_APPENDS)
@PER_KIND
@given(case=cs.cases(max_appends=2))
@example(case=cs.Case(CFG, 1, 2, 2, 8, torch.float16, 20, (3,), 1))
def test_bad_append_is_rejected_and_changes_nothing(impl, device, case, bad):
    what, error, fragment = bad
    case = fitted(impl, case, device)
    state = final_state(impl, case, device)
    before = observe(state.cache, impl)
    k, v = bad_append(what, *cs.append_tensors(cs.Case(**{**case.__dict__, "appends": (3,)}), 0, device))
    with pytest.raises(error, match=fragment):
        state.cache.append(k, v)
    assert_unchanged(before, observe(state.cache, impl))


@kinds(cs.BAD_PREFILLS)
@PER_KIND
@given(case=cs.cases(max_appends=0))
@example(case=cs.Case(CFG, 1, 2, 2, 8, torch.float16, 5, (), 2))
def test_bad_prefill_is_rejected(impl, device, case, bad):
    what, error, fragment = bad
    case = fitted(impl, case, device)
    q, k, v = bad_prefill(what, *cs.prefill_tensors(case, device))
    with pytest.raises(error, match=fragment):
        impl.create(case.config).prefill(q, k, v)


@kinds(cs.BAD_QUERIES)
@PER_KIND
@given(case=cs.cases(max_appends=2))
@example(case=cs.Case(CFG, 1, 2, 2, 8, torch.float16, 5, (), 3))
def test_bad_query_is_rejected_and_changes_nothing(impl, device, case, bad):
    what, error, fragment = bad
    case = fitted(impl, case, device)
    state = final_state(impl, case, device)
    before = observe(state.cache, impl)
    q = bad_query(what, cs.decode_queries(case, 1, device), state.length)
    with pytest.raises(error, match=fragment):
        state.cache.attend(q)
    assert_unchanged(before, observe(state.cache, impl))


def edit(t: torch.Tensor) -> None:
    """Change every entry of t in place."""
    if t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.add_(1)


@PER_KIND
@given(case=cs.cases(max_appends=2))
@example(case=cs.Case(CFG, 1, 2, 2, 8, torch.float16, 30, (3,), 4))
def test_editing_what_it_returns_changes_nothing(impl, device, case):
    case = fitted(impl, case, device)
    cache = final_state(impl, case, device).cache
    before = observe(cache, impl)
    returned = {
        "sinks()": cache.sinks(),
        "residual()": cache.residual(),
        "dequantize()": cache.dequantize(),
        "attend(q)": (cache.attend(cs.decode_queries(case, 1, device)),),
    }
    if impl.capabilities.prefill_selection:
        returned["pair_mask"] = (cache.pair_mask,)
    if impl.capabilities.reference_numerics:
        returned["key_codes()"] = tuple(cache.key_codes())
        returned["value_codes()"] = tuple(cache.value_codes() or ())
    for name, tensors in returned.items():
        for t in tensors:
            edit(t)
        edited = changed(before, observe(cache, impl))
        assert not edited, f"editing what {name} returned changed the cache's {', '.join(edited)}"
