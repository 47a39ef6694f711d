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
