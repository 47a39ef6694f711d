"""Property 8: the storage report counts the bytes of the tensors the cache actually holds;
with the opt-in claim `reference_layout` it also equals the reference's analytic model byte
for byte (the same components, the same sizes)."""

import pytest
import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import final_state, fitted, held_bytes, states
from reference import PNMixConfig, storage_model
from reference.channels.layout import CacheLayout


@pytest.mark.requires("reference_layout", "the reference's storage layout (reference.storage_model)")
@given(case=cs.cases())
@example(case=cs.Case(PNMixConfig(group_size=8, residual_length=8), 2, 3, 1, 20, torch.float16, 45, (7, 1), 1))
@example(case=cs.Case(PNMixConfig(value_bits=16, n_sink=0), 1, 1, 2, 4, torch.bfloat16, 129, (1,), 2))
def test_storage_report_is_exact(impl, device, case):
    case = fitted(impl, case, device)
    for state in states(impl, case, device):
        report = state.cache.storage()
        capacity = getattr(state.cache, "capacity", None)  # a preallocated cache reports its allocation
        model = storage_model(
            case.config, case.batch, case.kv_heads, case.head_dim, state.length, case.dtype, capacity=capacity
        )
        assert report == model, f"step {state.step}: report {report} differs from the analytic model {model}"


@pytest.mark.measurement
def test_the_common_workload_holds_what_it_reports(impl, device, record_property):
    """The same tokens through every implementation (`strategies.WORKLOAD`): the bits it holds
    per cached key and value element, measured from its own tensors, recorded for the report. A
    measurement, not a verdict (`measurement`: the report never shows it as a pass)."""
    case = fitted(impl, cs.WORKLOAD, device)
    state = final_state(impl, case, device)
    held = _held(impl, state)
    record_property("workload_bits_per_element", 8 * held / (2 * _elements(case, state)))
    record_property("workload_tokens", state.length)
    record_property("workload_head_dim", case.head_dim)


@pytest.mark.measurement
def test_the_realistic_workload_holds_what_it_reports(impl, device, record_property):
    """As the common workload, on `strategies.REALISTIC` (the paper's configuration over 4096
    tokens, head_dim 128, as far as the implementation's design admits): bits per element of all
    it holds, and of its keys and its values apart, by the components of its storage report
    (`reference.channels.layout.CacheLayout` says whose tokens each component holds: the pair mask counts
    with the keys; bookkeeping bytes a cache declares count only in the total)."""
    case = fitted(impl, cs.REALISTIC, device, draw_bounds=False)
    for name, value in cs.workload_record(case).items():
        record_property(name, value)
    state = final_state(impl, case, device)
    held, elements = _held(impl, state), _elements(case, state)
    record_property("realistic_bits_per_element", 8 * held / (2 * elements))
    layout = CacheLayout(case.config, case.batch, case.kv_heads, case.head_dim, case.dtype)
    stream = {c.name: c.stream for c in layout.components}
    parts = state.cache.storage().as_dict()
    for side in ("keys", "values"):
        side_bytes = sum(n for name, n in parts.items() if stream[name] == side)
        record_property(f"realistic_{side[:-1]}_bits_per_element", 8 * side_bytes / elements)


def _held(impl, state) -> int:
    """Bytes the cache holds: counted from its tensors where it is introspectable, else as its own
    report says (whether the two agree is `test_storage_report_counts_the_tensors_held`'s verdict)."""
    return held_bytes(state.cache) if impl.capabilities.storage_introspectable else state.cache.storage().total


def _elements(case: cs.Case, state) -> int:
    """Cached elements of the keys (as many of the values)."""
    return case.batch * case.kv_heads * state.length * case.head_dim


@given(case=cs.cases())
@example(case=cs.Case(PNMixConfig(group_size=8, residual_length=8, n_sink=3), 1, 2, 1, 16, torch.float16, 30, (9,), 3))
def test_storage_report_counts_the_tensors_held(impl, device, case):
    if not impl.capabilities.storage_introspectable:
        pytest.skip(f"{impl.name} holds memory the suite cannot see from the cache object")
    case = fitted(impl, case, device)
    for state in states(impl, case, device):
        held = held_bytes(state.cache)
        extra = impl.capabilities.bookkeeping_bytes
        assert state.cache.storage().total + extra == held, (
            f"step {state.step}: report total + {extra} declared bookkeeping bytes != {held} bytes held"
        )
