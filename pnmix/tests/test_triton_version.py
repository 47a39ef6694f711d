"""The triton versions the kernels support (pyproject.toml: triton>=3.6) are checked where pnmix imports triton,
and what triton 3.6's interpreter needs is mended there."""

import os
import re
import subprocess
import sys

import pytest
import torch
import triton

from pnmix import _runtime


@pytest.mark.parametrize("version", ["3.5.1", "3.0.0", "2.3.1", "3.5.0+git4f6a5b3", "nightly"])
def test_an_older_or_unreadable_triton_is_refused_naming_both_versions(monkeypatch, version):
    monkeypatch.setattr(triton, "__version__", version)
    with pytest.raises(_runtime.TritonVersionError) as caught:
        _runtime.require_triton()
    assert str(caught.value) == f"pnmix's Triton kernels need triton>=3.6; installed: triton {version}"
    assert isinstance(caught.value, ImportError)


@pytest.mark.parametrize(
    ("version", "expected"), [("3.6.0", (3, 6)), ("3.7.1", (3, 7)), ("3.10.0", (3, 10)), ("4.0.0+gitabc", (4, 0))]
)
def test_supported_versions_pass(monkeypatch, version, expected):
    monkeypatch.setattr(triton, "__version__", version)
    assert _runtime.require_triton() == expected


def test_the_declared_range_is_the_checked_one():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    # triton is the `triton` extra's alone: the core install (the spec, pnmix.hf's reference backend) needs none
    assert project["optional-dependencies"]["triton"] == [f"triton>={'.'.join(map(str, _runtime.MIN_TRITON))}"]
    assert not [r for r in project["dependencies"] if re.match(r"triton\b", r)]


def test_the_triton_cache_without_triton_says_which_extra_to_install():
    code = "import sys\nsys.modules['triton'] = None\nimport pnmix.hf\nprint('imported')\npnmix.PNMixCache\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stdout == "imported\n"  # the spec's path needs no triton
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pnmix._runtime.TritonVersionError: pnmix's Triton kernels need triton>=3.6, which is not")
    assert "pip install 'pnmix[triton]'" in last, done.stderr[-2000:]


def test_loading_the_triton_cache_with_an_older_triton_fails_with_the_versions():
    code = "import triton\ntriton.__version__ = '3.5.1'\nimport pnmix.hf\nprint('imported')\npnmix.PNMixCache\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stdout == "imported\n"  # the spec's path needs no triton
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "pnmix._runtime.TritonVersionError: pnmix's Triton kernels need triton>=3.6; installed: triton 3.5.1"
    ), done.stderr[-2000:]


@triton.jit
def _count(n_ptr, out_ptr):
    n = triton.language.load(n_ptr)
    total = 0
    for _ in range(0, n, 1):  # a loop bound read from memory, as the decode kernel's token ranges are
        total += 1
    triton.language.store(out_ptr, total)


@pytest.mark.interpreter
@pytest.mark.skipif(not _runtime.INTERPRETED, reason="the Triton interpreter only (TRITON_INTERPRET=1)")
def test_the_interpreter_runs_a_loop_bounded_by_a_loaded_count():
    """Triton 3.6's interpreter fails here under numpy >= 2.4 unless `_runtime` mends it."""
    out = torch.zeros(1, dtype=torch.int32)
    _count[(1,)](torch.tensor([5], dtype=torch.int32), out)
    assert out.item() == 5


@pytest.mark.parametrize(("version", "swapped"), [((3, 6), False), ((3, 7), True)])
def test_bfloat16_values_keep_their_operand_roles_on_sm_90_under_triton_3_6(monkeypatch, version, swapped):
    """Triton 3.6 spills the decode kernel's bfloat16 loop with swapped value operands on sm_90 (`python -m pnmix.aot
    --default`: 8 B per thread); float16 and sm_80 choose as before."""
    from pnmix.kernels import attention
    from reference import PNMixConfig
    from reference.channels.layout import CacheLayout

    monkeypatch.setattr(_runtime, "TRITON_VERSION", version)
    layouts = {dtype: CacheLayout(PNMixConfig(), 1, 8, 128, dtype) for dtype in (torch.bfloat16, torch.float16)}
    for arch, dtype, expected in [
        (90, torch.bfloat16, swapped),
        (90, torch.float16, True),
        (80, torch.bfloat16, False),
    ]:
        monkeypatch.setattr(_runtime, "target", lambda arch=arch: _runtime.Target(arch, 132))
        assert attention.launch_config(layouts[dtype])["swap_v"] is expected, (arch, dtype)
