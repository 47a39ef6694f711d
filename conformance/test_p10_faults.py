"""Property 10: all or nothing. A state machine drives random sequences of prefill, append and
attend, each call failed at a drawn point of its own work (the n-th torch call it makes raises
an out-of-memory error, `reference.contract.faults`); after every step the cache must equal, in all
the protocol shows (length, saliency count, storage, selection, dequantized keys and values,
attention, bit for bit), a twin of the same implementation fed only the calls that succeeded.
A call that fails leaves the cache exactly as it was, whatever failed inside it. Before the
drawn sequences, the same in every run: a prefill failed at calls spread over its work."""

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from conformance import strategies as cs
from conformance.harness import TALLY, assert_unchanged, bits_of, fitted, observe
from reference import PNMixConfig
from reference.contract.faults import FaultAt

#: Small pages, so that a few short appends cross page boundaries (flushes) and sinks fill.
BASE = cs.Case(PNMixConfig(group_size=8, residual_length=8, n_sink=2), 1, 2, 2, 16, torch.float16, 8, (), 10)
#: Where a call fails: none, or its n-th torch call (small n are drawn first and shrink to).
FAULTS = st.none() | st.integers(0, 400)
TWIN = "the cache differs from a twin fed only the successful calls in its"


def machine(impl, device, case: cs.Case):
    step, cap = impl.capabilities.token_multiple, impl.capabilities.max_tokens
    sizes = st.integers(1, 3 * case.config.residual_length // step).map(lambda n: n * step)

    class AllOrNothing(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.cache, self.twin, self.length = impl.create(case.config), None, 0
            TALLY.run += 1  # each drawn sequence of calls is one example

        def tensors(self, heads: int, n: int, seed: int) -> torch.Tensor:
            shape = (case.batch, heads, n, case.head_dim)
            return cs.values(shape, case.dtype, "normal", seed).to(device)

        def call(self, fault: int | None, method: str, *args) -> tuple[bool, object]:
            """(succeeded, result) of cache.method(*args) failed at torch call `fault`."""
            injected = FaultAt(fault)
            try:
                with injected:
                    return True, getattr(self.cache, method)(*args)
            except Exception:
                if not injected.fired:
                    raise
                return False, None

        @precondition(lambda self: self.twin is None)
        @rule(n=sizes, seed=st.integers(0, 2**16), fault=FAULTS)
        def prefill(self, n: int, seed: int, fault: int | None) -> None:
            n = min(n, cap // step * step)
            args = (self.tensors(case.heads, n, seed), *(self.tensors(case.kv_heads, n, seed + i) for i in (1, 2)))
            ok, _ = self.call(fault, "prefill", *args)
            if ok:
                self.twin = impl.create(case.config)
                self.twin.prefill(*args)
                self.length = n

        @precondition(lambda self: self.twin is not None and self.length + step <= cap)
        @rule(n=sizes, seed=st.integers(0, 2**16), fault=FAULTS)
        def append(self, n: int, seed: int, fault: int | None) -> None:
            n = min(n, (cap - self.length) // step * step)
            args = tuple(self.tensors(case.kv_heads, n, seed + i) for i in (0, 1))
            ok, _ = self.call(fault, "append", *args)
            if ok:
                self.twin.append(*args)
                self.length += n

        @precondition(lambda self: self.twin is not None)
        @rule(seed=st.integers(0, 2**16), fault=FAULTS)
        def attend(self, seed: int, fault: int | None) -> None:
            q = self.tensors(case.heads, 1, seed)
            ok, out = self.call(fault, "attend", q)
            if ok:
                assert torch.equal(bits_of(out), bits_of(self.twin.attend(q))), f"{TWIN} attention"

        @invariant()
        def equals_its_twin(self) -> None:
            if self.twin is None:  # every prefill so far failed: the cache is still new
                assert (self.cache.length, self.cache.saliency_computations) == (0, 0), (
                    f"a failed prefill left length {self.cache.length}, "
                    f"saliency count {self.cache.saliency_computations}"
                )
                return
            assert_unchanged(observe(self.twin, impl), observe(self.cache, impl), TWIN)

    return AllOrNothing


def spread(n: int) -> list[int]:
    """About 8 torch-call indices spread over n calls, and the last 4 (which follow any write)."""
    return sorted({*range(0, n, max(1, n // 8)), *range(max(0, n - 4), n)})


def test_a_failed_call_leaves_the_cache_as_it_was(impl, device):
    case = fitted(impl, BASE, device)
    # First, the same every run: a prefill failed at calls spread over its work leaves a new cache.
    q, k, v = cs.prefill_tensors(case, device)
    count = FaultAt(None)
    with count:
        impl.create(case.config).prefill(q, k, v)
    for at in spread(count.calls):
        cache, fault = impl.create(case.config), FaultAt(at)
        try:
            with fault:
                cache.prefill(q, k, v)
        except Exception:
            if not fault.fired:
                raise
        assert (cache.length, cache.saliency_computations) == (0, 0), (
            f"a prefill failed at torch call {at} left length {cache.length}, "
            f"saliency count {cache.saliency_computations}"
        )
    # A third of the profile's examples of 6 calls: each runs the implementation twice (and the
    # interpreted kernels are slow); `--hypothesis-profile thorough` draws 166.
    budget = settings(
        max_examples=max(2, settings().max_examples // 3),
        stateful_step_count=6,
        suppress_health_check=[HealthCheck.too_slow],
    )
    run_state_machine_as_test(machine(impl, device, case), settings=budget)
