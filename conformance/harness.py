"""Building caches for a drawn case through the protocol, state by state (not a test module)."""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import currently_in_test_context, note, settings
from hypothesis.errors import UnsatisfiedAssumption

from conformance import strategies as cs
from reference import ReferenceCache, attention_ref
from reference.contract import Capabilities, Derived
from reference.contract.tolerances import attention_bound


@dataclass
class State:
    """One moment of a scenario: the cache under test, the reference cache, the token history."""

    cache: object
    ref: ReferenceCache
    q_prefill: torch.Tensor
    all_k: torch.Tensor
    all_v: torch.Tensor
    step: int  # 0 after prefill, i after the i-th append
    calls: tuple[int, ...] = ()  # tokens of the prompt, then of each append so far

    @property
    def length(self) -> int:
        return self.all_k.shape[-2]


#: The hypothesis profile that checks a pipeline, not conformance (conftest.py): no combination examples.
SMOKE = "smoke"
#: The hypothesis profile of `gpu_check --short` (conftest.py): explicit examples only, the first of each dtype
#: of a property and implementation alone (`fitted` drops the others), so that a compiled run compiles few kernels.
GPU_SHORT = "gpu-short"
_LAST_FITTED: list = []
#: Starts the hypothesis note naming the fitted case of a failing example (`failing_examples` reads it).
FITTED_NOTE = "Fitted to the claims: "


class Dropped(UnsatisfiedAssumption):
    """One example lies outside the implementation's claims: hypothesis drops that example (as
    `reject()` does), and a property none of whose examples ran is skipped (`conformance.plugin`)."""


@dataclass
class Tally:
    """How many examples of the running property ran, and which were dropped and why."""

    run: int = 0
    dropped: collections.Counter = field(default_factory=collections.Counter)
    dtypes: set = field(default_factory=set)  # the input dtypes of the examples fitted (the GPU_SHORT profile)

    def reasons(self, shown: int = 3) -> str:
        """The reasons examples were dropped, the most frequent first, with their counts."""
        common = self.dropped.most_common()
        text = "; ".join(f"{reason} ({n} example{'s' * (n > 1)})" for reason, n in common[:shown])
        rest = sum(n for _, n in common[shown:])
        return text + (f"; {rest} more for {len(common) - shown} other reasons" if rest else "")


TALLY = Tally()


def drop(reason: str):
    """Drop this example, not the property: it lies outside the claims (`reason` says how)."""
    TALLY.dropped[reason] += 1
    raise Dropped(reason)


def counting(test):
    """`test` (one example of a property) counted in `TALLY`: run, unless dropped or skipped whole."""
    if getattr(test, "_counted", False):
        return test

    @functools.wraps(test)
    def counted(*args, **kwargs):
        try:
            result = test(*args, **kwargs)
        except (UnsatisfiedAssumption, pytest.skip.Exception):
            raise
        except BaseException:
            TALLY.run += 1
            raise
        TALLY.run += 1
        return result

    counted._counted = True
    return counted


def fitted(impl, case, device: torch.device, *, draw_bounds: bool = True):
    """The case (a `strategies.Case` or `TokenCase`) fitted to the implementation's claims. Skips the
    property if the device is not claimed; drops the example (`drop`) if no case of its kind fits the
    claims, the reason naming what does not fit. draw_bounds=False: a fixed workload, not bounded by
    max_tokens and max_head_dim (`strategies.fit_fixed`)."""
    caps: Capabilities = impl.capabilities
    if device.type not in caps.devices:
        pytest.skip(f"{impl.name} does not claim device {device.type}")
    try:
        case = case.fit(caps) if draw_bounds else cs.fit_fixed(case, caps)
    except cs.DoesNotFit as err:
        drop(f"{impl.name}: {err}")
    if settings.get_current_profile_name() == GPU_SHORT:
        if case.dtype in TALLY.dtypes:
            drop(f"the {GPU_SHORT} profile runs one example per dtype ({str(case.dtype).removeprefix('torch.')} ran)")
        TALLY.dtypes.add(case.dtype)
    _LAST_FITTED[:] = [case]
    # Notes are kept only on the replay of a failing example: each failure carries its own fitted case.
    if currently_in_test_context():
        note(FITTED_NOTE + cs.compact(case))
    return case


def covers_claimed_combinations(base: cs.Case, fixed: dict | None = None, **narrow):
    """Run a property first on `strategies.claimed_combinations(impl.capabilities, base, **narrow)`,
    explicit examples derived from each implementation's claims, then on its own examples and
    draws. `fixed` gives the property's other drawn arguments for these cases. Goes outside
    @given (it calls the property's examples through hypothesis' `inner_test`)."""

    def decorate(test):
        @functools.wraps(test)
        def run(impl, device, **kwargs):
            example = test.hypothesis.inner_test
            # the smoke profile checks a pipeline (two examples a property), not conformance
            combinations = (
                []
                if settings.get_current_profile_name() == SMOKE
                else cs.claimed_combinations(impl.capabilities, base, **narrow)
            )
            for case in combinations:
                try:
                    example(impl=impl, device=device, case=case, **(fixed or {}), **kwargs)
                except Dropped:
                    continue
                except Exception as err:  # the failure names the combination, as hypothesis' examples do
                    err.add_note(FITTED_NOTE + cs.compact(last_fitted() or case))
                    raise
            return test(impl=impl, device=device, **kwargs)

        return run

    return decorate


def last_fitted():
    """The case the running test fitted last (after a hypothesis failure: the failing example's)."""
    return _LAST_FITTED[0] if _LAST_FITTED else None


def forget_fitted() -> None:
    _LAST_FITTED.clear()
    TALLY.run = 0
    TALLY.dropped.clear()
    TALLY.dtypes.clear()


def failing_examples(exc: BaseException) -> list[str]:
    """The fitted cases hypothesis noted on a failure (`FITTED_NOTE`), in order, without repeats."""
    notes = getattr(exc, "__notes__", None) or []
    return list(dict.fromkeys(n.removeprefix(FITTED_NOTE) for n in notes if n.startswith(FITTED_NOTE)))


def states(impl, case: cs.Case, device: torch.device) -> Iterator[State]:
    """Prefill, then each append of the case, yielding the state after every call."""
    q, k, v = cs.prefill_tensors(case, device)
    cache = impl.create(case.config)
    cache.prefill(q, k, v)
    ref = ReferenceCache.from_prefill(q.cpu(), k.cpu(), v.cpu(), case.config)
    all_k, all_v = k.cpu(), v.cpu()
    yield State(cache, ref, q.cpu(), all_k, all_v, 0, (case.prompt,))
    for i in range(len(case.appends)):
        new_k, new_v = cs.append_tensors(case, i, device)
        cache.append(new_k, new_v)
        ref.append(new_k.cpu(), new_v.cpu())
        all_k, all_v = torch.cat([all_k, new_k.cpu()], -2), torch.cat([all_v, new_v.cpu()], -2)
        yield State(cache, ref, q.cpu(), all_k, all_v, i + 1, (case.prompt, *case.appends[: i + 1]))


def final_state(impl, case: cs.Case, device: torch.device) -> State:
    *_, last = states(impl, case, device)
    return last


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of a float tensor, so -0.0 and 0.0 differ (bit-identity checks)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def held_bytes(obj: object) -> int:
    """Bytes of the distinct tensor storages reachable from obj's attributes (its own memory), less its
    derived state (`reference.contract.Derived`)."""
    seen_objects: set[int] = set()
    storages: dict[tuple, int] = {}

    def visit(x: object) -> None:
        if id(x) in seen_objects:
            return
        seen_objects.add(id(x))
        if isinstance(x, torch.Tensor) and type(x) is not torch.Tensor and hasattr(x, "__tensor_flatten__"):
            for name in x.__tensor_flatten__()[0]:  # a tensor subclass (e.g. quanto's): its inner tensors
                visit(getattr(x, name))
        elif isinstance(x, Derived):  # computed from the stored tensors, to read them faster: not stored
            return
        elif isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            storages[(x.device.type, x.device.index, s.data_ptr())] = s.nbytes()
        elif isinstance(x, dict):
            for value in x.values():
                visit(value)
        elif isinstance(x, (list, tuple, set, frozenset)):
            for value in x:
                visit(value)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, types.ModuleType, types.FunctionType)):
            for value in vars(x).values():
                visit(value)

    visit(obj)
    return sum(storages.values())


def observe(cache, impl) -> dict:
    """Everything the protocol can see of a cache (the pair mask where the method has one)."""
    k, v = cache.dequantize()
    return {
        "length": cache.length,
        "saliency": cache.saliency_computations,
        "storage": cache.storage(),
        "mask": cache.pair_mask.clone() if impl.capabilities.prefill_selection else None,
        "k": bits_of(k).clone(),
        "v": bits_of(v).clone(),
    }


def changed(before: dict, after: dict) -> list[str]:
    """What differs (bit for bit) between two `observe` results."""
    return [
        key
        for key, value in before.items()
        if not (torch.equal(value, after[key]) if isinstance(value, torch.Tensor) else value == after[key])
    ]


def assert_unchanged(before: dict, after: dict, why: str = "a rejected call changed the cache's") -> None:
    """`observe` gave the same before and after (bit for bit); `why` starts the failure message."""
    differ = changed(before, after)
    assert not differ, f"{why} {differ[0]}"


def judge(out: torch.Tensor, q: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor) -> tuple[float, float, float]:
    """(error against the float64 oracle over k_hat, v_hat; its bound; the spec computation's own error)."""
    oracle = attention_ref(q.double(), k_hat.double(), v_hat.double(), causal=True, upcast=False)
    low = attention_ref(q, k_hat.to(q.dtype), v_hat.to(q.dtype), causal=True, upcast=True)
    assert bool(torch.isfinite(low).all()), "strategy error: these inputs overflow attention in the dtype"
    err = (out.double() - oracle).abs().max().item()
    return err, attention_bound(oracle, low, q.dtype), (low.double() - oracle).abs().max().item()
