"""The benchmark harness: static caches allocate what the storage model says; misuse is named."""

import pytest
import torch

from benchmarks import harness, memory
from benchmarks.models import tiny_architecture

ARCH = tiny_architecture()


@pytest.fixture(scope="module")
def model():
    return harness.build_model(ARCH, torch.device("cpu"), torch.bfloat16)


def test_fp16_generation_is_exact_bytes_and_checks_capacity(model):
    gen = harness.Generation(model, "FP16", 2, 20, 64)
    assert harness.measured_cache_bytes(gen.cache) == memory.cache_bytes(ARCH, "FP16", 2, 64)
    gen.fill_to(63)
    gen.step()
    assert gen.length == 64
    with pytest.raises(ValueError, match="cache is full"):
        gen.step()
    with pytest.raises(ValueError, match="length must be within"):
        gen.fill_to(10)


def test_prompt_must_fit(model):
    with pytest.raises(ValueError, match=r"capacity \(64\) must exceed the prompt"):
        harness.Generation(model, "PN-Mix", 1, 64, 64)
    with pytest.raises(ValueError, match="method must be one of"):
        harness.Generation(model, "KIVI-3", 1, 8, 64)


def test_time_ms_reports_cpu_wall_time_only():
    t = harness.time_ms(lambda: sum(range(1000)), torch.device("cpu"), reps=3, warmup=1)
    assert t["gpu_ms"] is None and t["ms"] == t["wall_ms"] > 0


def test_out_of_memory_is_a_data_point_and_other_errors_are_not():
    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    cpu = torch.device("cpu")
    assert harness.unless_oom(oom, cpu, tokens_per_s=None) == {"oom": True, "tokens_per_s": None}
    assert harness.unless_oom(lambda: {"tokens_per_s": 3.0}, cpu) == {"oom": False, "tokens_per_s": 3.0}
    with pytest.raises(ZeroDivisionError):
        harness.unless_oom(lambda: 1 / 0, cpu)
