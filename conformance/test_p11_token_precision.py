"""Property 11: per-token precision (TriAxialKV, role-aware PN-Mix), for implementations that claim it
(`Capabilities.token_precision`). What is checked, against the spec's
`reference.tokens.cache.TokenPrecisionCache` fed the same calls:

- every token is held at its own precision: each dequantized element lies within 1.5 quantization
  steps of the spec's (its step: the spec's stored scale of that element's group; a faithful
  implementation that rounds a tie or a scale differently moves an element by at most one step of
  its own group, plus half a step of the high path where leftover keys are requantized from it),
  and bit for bit with the opt-in `reference_numerics`;
- the cache says which precision each token has, the bits it was given;
- its storage: the bytes it reports are at most the spec's accounting (plus its declared
  bookkeeping), equal part by part with `reference_layout`, and are the bytes it holds;
- decode attention over its own cache within the low-precision error (property 7's rule);
- bad token bits are refused by name and a fault in a call leaves the cache as it was.
It never reads an implementation's bytes unless the implementation claims `reference_layout`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conformance import strategies as cs
from conformance.harness import bits_of, fitted, held_bytes, judge
from reference import attention_ref
from reference.channels.layout import VALUE
from reference.contract.faults import FaultAt
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import CLASS_MAP, TokenClasses, TokenPrecisionConfig, components

pytestmark = pytest.mark.token_precision

CFG = TokenPrecisionConfig(group_size=8)
PAIRS = TokenPrecisionConfig(group_size=8, low_keys="pairs")


def build(impl, case: cs.TokenCase, device: torch.device, calls: int | None = None):
    """(cache under test, spec cache, every token's bits) after the case's first `calls` calls (all by default)."""
    n = len(case.calls) if calls is None else calls
    cache, spec, bits = impl.create(case.config), TokenPrecisionCache(case.config), []
    for call in range(n):
        q, k, v = cs.token_tensors(case, call, device)
        b = cs.token_bits(case, call)
        if call == 0:
            cache.prefill(q, k, v, b)
            spec.prefill(q.cpu(), k.cpu(), v.cpu(), b)
        else:
            cache.append(k, v, b)
            spec.append(k.cpu(), v.cpu(), b)
        bits.append(b)
    return cache, spec, torch.cat(bits)


def observe(cache) -> dict:
    k, v = cache.dequantize()
    return {
        "length": cache.length,
        "bits": torch.as_tensor(cache.token_bits()).cpu().long(),
        "storage": cache.storage(),
        "k": bits_of(k.cpu()).clone(),
        "v": bits_of(v.cpu()).clone(),
    }


def differences(a: dict, b: dict) -> list[str]:
    return [n for n, x in a.items() if not (torch.equal(x, b[n]) if isinstance(x, torch.Tensor) else x == b[n])]


@given(case=cs.token_cases())
@example(case=cs.TokenCase(CFG, 1, 2, 2, 16, torch.float16, 37, (1, 9, 30), 0.8, 5))
@example(case=cs.TokenCase(PAIRS, 2, 1, 3, 16, torch.bfloat16, 20, (12, 1, 1), 1.0, 6, "wide_range"))
def test_every_token_is_held_at_its_precision(impl, device, case):
    case = fitted(impl, case, device)
    cache, spec, _ = build(impl, case, device)
    got = [t.cpu() for t in cache.dequantize()]
    want, steps = spec.dequantize(), spec.steps()
    if impl.capabilities.reference_numerics:
        for name, a, b in zip("kv", got, want, strict=True):
            assert torch.equal(bits_of(a), bits_of(b)), f"{name}: not the spec's reconstruction bit for bit"
        return
    eps = torch.finfo(case.config.scale_dtype).eps
    for name, a, b, step in zip("kv", got, want, steps, strict=True):
        excess = (a - b).abs() - (1.5 * step + 2 * eps * b.abs())
        worst = int(excess.flatten().argmax())
        token = worst // case.head_dim % cache.length
        off = float((a - b).abs().flatten()[worst])
        assert float(excess.max()) <= 0, (
            f"{name}: token {token} ({int(spec.token_bits()[token])} bits) is {off:.4g} from the spec's value, "
            f"more than 1.5 quantization steps ({float(step.flatten()[worst]):.4g})"
        )


@given(case=cs.token_cases())
def test_token_bits_are_the_ones_given(impl, device, case):
    case = fitted(impl, case, device)
    cache, _, bits = build(impl, case, device)
    held = torch.as_tensor(cache.token_bits()).cpu().long()
    assert cache.length == len(bits), f"length {cache.length}, expected {len(bits)}"
    assert torch.equal(held, bits), f"token_bits() differs from the bits given at {int((held != bits).nonzero()[0])}"


@given(case=cs.token_cases())
@example(case=cs.TokenCase(PAIRS, 1, 2, 1, 16, torch.float16, 50, (3, 20), 0.5, 7))
def test_storage_is_the_accounting(impl, device, case):
    case = fitted(impl, case, device)
    cache, spec, _ = build(impl, case, device)
    caps, report, model = impl.capabilities, cache.storage(), spec.storage()
    total = sum(report.values())
    if caps.reference_layout:
        assert report == model, f"storage {report} is not the spec's accounting {model}"
    else:
        assert total <= sum(model.values()) + caps.bookkeeping_bytes, (
            f"{total} bytes held, more than the spec's accounting {sum(model.values())} "
            f"plus bookkeeping {caps.bookkeeping_bytes}"
        )
    if caps.storage_introspectable:
        held = held_bytes(cache) - caps.bookkeeping_bytes
        assert held == total, f"the cache holds {held} bytes of tensors but reports {total}"


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cs.token_cases(), n_queries=st.integers(1, 3))
@example(case=cs.TokenCase(CFG, 1, 2, 2, 16, torch.float16, 37, (1, 9, 30), 0.8, 5), n_queries=1)
@example(case=cs.TokenCase(PAIRS, 2, 1, 3, 16, torch.bfloat16, 20, (12, 1, 1), 1.0, 6), n_queries=2)
def test_attention_over_its_own_cache_within_the_low_precision_error(impl, device, case, n_queries):
    case = fitted(impl, case, device)
    cache, _, _ = build(impl, case, device)
    q = cs.values((case.batch, case.heads, min(n_queries, cache.length), case.head_dim), case.dtype, "unit", case.seed)
    out = cache.attend(q.to(device))
    assert out.shape == q.shape and out.dtype == q.dtype, f"attend returned {tuple(out.shape)} {out.dtype}"
    err, bound, ref_err = judge(out.cpu(), q, *(t.cpu() for t in cache.dequantize()))
    assert err <= bound, f"attention error {err:.3g} above {bound:.3g} (spec computation {ref_err:.3g})"


@pytest.mark.measurement
def test_the_realistic_token_workload_holds_what_it_reports(impl, device, record_property):
    """The channel caches' realistic workload for a per-token cache (`strategies.REALISTIC_TOKENS`:
    4096 tokens, head_dim 128, its own configuration, half the tokens low): the bits it holds per
    cached key and value element, and of its keys and its values apart by its storage report's parts
    (the class map and the pair mask count with the keys), recorded for the report. A measurement."""
    case = fitted(impl, cs.REALISTIC_TOKENS, device, draw_bounds=False)
    for name, value in cs.workload_record(case).items():
        record_property(name, value)
    cache, _, _ = build(impl, case, device)
    caps, parts = impl.capabilities, cache.storage()
    held = held_bytes(cache) if caps.storage_introspectable else sum(parts.values())
    elements = case.batch * case.kv_heads * cache.length * case.head_dim
    record_property("realistic_bits_per_element", 8 * held / (2 * elements))
    kinds = {p.name: p.counts_as for p in components(case.config, case.head_dim, TokenClasses(0, 0, 0))}
    if set(parts) <= set(kinds) | {CLASS_MAP}:  # its parts are the spec's: keys and values can be told apart
        keys = sum(n for name, n in parts.items() if name == CLASS_MAP or kinds[name] != VALUE)
        record_property("realistic_key_bits_per_element", 8 * keys / elements)
        record_property("realistic_value_bits_per_element", 8 * (sum(parts.values()) - keys) / elements)


def test_the_realistic_token_workload_attention(impl, device, record_property):
    """As the channel caches' realistic workload: one decode query's distance from float64 attention
    over the exact tokens, recorded for the report (the error its quantization costs), then judged
    within the low-precision error over its own cache."""
    case = fitted(impl, cs.REALISTIC_TOKENS, device, draw_bounds=False)
    for name, value in cs.workload_record(case).items():
        record_property(name, value)
    cache, _, _ = build(impl, case, device)
    k = torch.cat([cs.token_tensors(case, c, "cpu")[1] for c in range(len(case.calls))], -2)
    v = torch.cat([cs.token_tensors(case, c, "cpu")[2] for c in range(len(case.calls))], -2)
    q = cs.values((case.batch, case.heads, 1, case.head_dim), case.dtype, "unit", case.seed + 99)
    out = cache.attend(q.to(device)).cpu()
    exact = attention_ref(q.double(), k.double(), v.double(), causal=True, upcast=False)
    record_property("realistic_attention_error", (out.double() - exact).abs().max().item())
    err, bound, _ = judge(out, q, *(t.cpu() for t in cache.dequantize()))
    assert err <= bound, f"attention error {err:.3g} above {bound:.3g} (over the implementation's own cache)"


BAD_BITS = (
    ("too_few", ValueError, lambda b, cfg: b[:-1]),
    ("not_a_precision", ValueError, lambda b, cfg: torch.full_like(b, cfg.high_bits + cfg.low_bits)),
    ("floats", TypeError, lambda b, cfg: b.float()),
    ("two_dims", ValueError, lambda b, cfg: b[None]),
)


@given(case=cs.token_cases(), bad=st.sampled_from(BAD_BITS))
def test_bad_token_bits_are_refused_and_change_nothing(impl, device, case, bad):
    case = fitted(impl, case, device)
    if len(case.calls) < 2:
        case = dataclasses.replace(case, appends=(3,))
    cache, _, _ = build(impl, case, device, calls=len(case.calls) - 1)
    before = observe(cache)
    _, k, v = cs.token_tensors(case, len(case.calls) - 1, device)
    what, error, broken = bad
    with pytest.raises(error, match="token_bits"):
        cache.append(k, v, broken(cs.token_bits(case, len(case.calls) - 1), case.config))
    assert not differences(before, observe(cache)), f"a refused append ({what}) changed the cache"


@given(case=cs.token_cases(), at=st.floats(0, 1))
def test_a_fault_leaves_the_cache_as_it_was(impl, device, case, at):
    case = fitted(impl, case, device)
    if len(case.calls) < 2:
        case = dataclasses.replace(case, appends=(5,))
    last = len(case.calls) - 1
    cache, _, _ = build(impl, case, device, calls=last)
    before = observe(cache)
    _, k, v = cs.token_tensors(case, last, device)
    bits = cs.token_bits(case, last)
    twin, _, _ = build(impl, case, device, calls=last)
    with FaultAt(None) as count:
        twin.append(k, v, bits)
    fault = FaultAt(int(at * max(count.calls - 1, 0)))
    try:
        with fault:
            cache.append(k, v, bits)
    except torch.OutOfMemoryError:
        pass
    if fault.fired:
        try:
            after = observe(cache)
        except Exception as err:  # any failure to read the cache back is the verdict
            raise AssertionError(f"a failed append left the cache unreadable: {type(err).__name__}: {err}") from err
        assert not differences(before, after), "a failed append left the cache changed"
        cache.append(k, v, bits)  # and the cache still works
    assert not differences(observe(twin), observe(cache)), "after the append the cache differs from a twin's"
