"""Kernels run under the interpreter without CUDA, unless the user decided otherwise."""

import os
import subprocess
import sys

import pytest
import torch

CODE = "import os, pnmix._runtime as r; print(os.environ.get('TRITON_INTERPRET'), r.INTERPRETED)"


def run(env_update):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_interpreter_is_chosen_without_cuda():
    assert run({}).split() == ["1", "True"]


def test_an_explicit_setting_is_respected():
    assert run({"TRITON_INTERPRET": "0"}).split() == ["0", "False"]


#: A plug-in that imports triton while it loads (as one that imports transformers can, through
#: torch.compile), and a test that reads how triton's own library functions were decorated.
PLUGIN = """
import triton.language
from conformance.impls.template import TemplateImplementation


def make():
    return TemplateImplementation()
"""
PROBE = """
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


def test_triton_library_functions_run_on_the_interpreter():
    assert isinstance(tl.standard.min, InterpretedFunction), type(tl.standard.min)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_a_plugin_that_imports_triton_while_it_loads_leaves_the_kernels_on_the_interpreter(tmp_path):
    (tmp_path / "triton_first.py").write_text(PLUGIN)
    (tmp_path / "test_probe.py").write_text(PROBE)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), root, env.get("PYTHONPATH", "")])
    # the probe lives outside the repository, so the project's conftest comes in as a plug-in
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "--rootdir", root, "-c"]
    argv += [os.path.join(root, "pyproject.toml"), "--impl", "triton_first:make", str(tmp_path / "test_probe.py")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


LATE = (
    "import warnings, torch, triton.language, pnmix\n"
    "cache = pnmix.PNMixCache(pnmix.PNMixConfig())\n"
    "q, k = torch.zeros(1, 2, 40, 16, dtype=torch.float16), torch.zeros(1, 1, 40, 16, dtype=torch.float16)\n"
    "try:\n"
    "    cache.prefill(q, k, k)\n"
    "except RuntimeError as e:\n"
    "    print('refused:', e)\n"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_triton_imported_before_pnmix_is_named_not_a_failure_inside_a_kernel():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", LATE], env=env, capture_output=True, text=True, timeout=300)
    assert "refused: triton was imported before TRITON_INTERPRET=1 was set" in done.stdout, done.stdout + done.stderr


LAZY = (
    "import os, sys, pnmix.hf\n"
    "loaded = sorted(m for m in sys.modules if m in ('pnmix.cache', 'pnmix._runtime', 'pnmix.protocol')"
    " or m.startswith('pnmix.kernels'))\n"
    "print(os.environ.get('TRITON_INTERPRET'), loaded)\n"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_pnmix_hf_loads_no_triton_code_until_a_triton_backend_is_asked_for():
    """`import pnmix.hf` (the transformers cache, reference backend) loads none of pnmix's Triton modules, and
    still decides TRITON_INTERPRET first; `pnmix.PNMixCache` loads them when asked for."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", LAZY], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.split(maxsplit=1) == ["1", "[]\n"], done.stdout + done.stderr[-2000:]
    asked = LAZY.replace("import os, sys, pnmix.hf\n", "import os, sys, pnmix.hf, pnmix\npnmix.PNMixCache\n")
    done = subprocess.run([sys.executable, "-c", asked], env=env, capture_output=True, text=True, timeout=300)
    assert "'pnmix.cache'" in done.stdout and "'pnmix.kernels'" in done.stdout, done.stdout + done.stderr[-2000:]
