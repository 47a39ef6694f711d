"""The `gpu-short` hypothesis profile (conftest.py) of `gpu_check --short`'s compiled conformance step: explicit
examples only, and of a property's examples for an implementation the first of each input dtype alone."""

import dataclasses
import types

import pytest
import torch
from hypothesis import Phase, settings

from conformance import harness
from conformance import strategies as cs
from reference import PNMixConfig
from reference.contract import Capabilities

BASE = cs.Case(PNMixConfig(group_size=8, residual_length=8, n_sink=1), 1, 2, 2, 8, torch.float16, 19, (6,), 60)
IMPL = types.SimpleNamespace(name="claims", capabilities=Capabilities(devices=("cpu",)))
CPU = torch.device("cpu")


def case(dtype: torch.dtype, seed: int) -> cs.Case:
    return dataclasses.replace(BASE, dtype=dtype, seed=seed)


@pytest.fixture
def gpu_short():
    previous = settings.get_current_profile_name()
    settings.load_profile(harness.GPU_SHORT)
    harness.forget_fitted()
    try:
        yield settings.get_profile(harness.GPU_SHORT)
    finally:
        settings.load_profile(previous)
        harness.forget_fitted()


def test_the_gpu_short_profile_runs_the_first_example_of_each_dtype(gpu_short):
    assert tuple(gpu_short.phases) == (Phase.explicit,) and gpu_short.database is None  # no draws, nothing kept
    assert harness.fitted(IMPL, case(torch.float16, 1), CPU).dtype == torch.float16
    with pytest.raises(harness.Dropped, match=r"one example per dtype \(float16 ran\)"):
        harness.fitted(IMPL, case(torch.float16, 2), CPU)
    assert harness.fitted(IMPL, case(torch.bfloat16, 3), CPU).dtype == torch.bfloat16
    assert sum(harness.TALLY.dropped.values()) == 1
    harness.forget_fitted()  # the next property, or the next implementation, starts again
    assert harness.fitted(IMPL, case(torch.float16, 4), CPU).dtype == torch.float16


def test_other_profiles_run_every_example():
    harness.forget_fitted()
    assert settings.get_current_profile_name() != harness.GPU_SHORT
    assert [harness.fitted(IMPL, case(torch.float16, seed), CPU).seed for seed in (1, 2)] == [1, 2]
    harness.forget_fitted()
