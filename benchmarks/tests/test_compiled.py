"""A kernel timing's machine-code record: faithful only where compiling ahead of time reproduces the kernels that
ran, and then reproduced by compiling again (`moved`); the report's use of it is tested in
reports/tests/test_currency.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.efficiency import compiled
from pnmix import _runtime, aot, sass

needs_tools = pytest.mark.skipif(isinstance(sass.toolchain(), str), reason=f"toolchain absent: {sass.toolchain()}")
CASE, TARGET = aot.Case("PN-Mix", "float16", 128, 4), _runtime.Target(90, 132)


def test_nothing_is_recorded_off_a_gpu():
    ran = [("_split_kernel", None)]
    assert "why" in compiled.record("PN-Mix", (2, 4, 128), torch.float16, ran, torch.device("cpu"))


#: Run compiled (kernels of an interpreted process cannot be recorded): the merge kernel as a GPU would have
#: run it, compiled for sm_90, then for sm_80, each recorded as the timing of an H200 records it.
SCRIPT = """
import json
from benchmarks.efficiency import compiled
from pnmix import _runtime, aot
case, target = aot.Case("PN-Mix", "float16", 128, 4), _runtime.Target(90, 132)
merge = [x for x in aot.record_launches(case, target)[0] if x.name == "_merge_kernel"][:1]
out = {}
for arch in (90, 80):
    rec = compiled.record_of(case, target, False, [(x.name, aot._compile(x, arch)) for x in merge])
    out[arch] = {"record": rec, "moved": compiled.moved(rec) if compiled.faithful(rec) else None}
print(json.dumps(out))
"""


@pytest.mark.gpu_gate
@needs_tools
def test_kernels_compiled_for_the_target_make_a_faithful_record_that_stays_current():
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    rec = out["90"]["record"]
    assert rec["faithful"] and compiled.faithful(rec) and out["90"]["moved"] == [], rec  # the same SASS here
    assert list(rec["ran"]) == ["_merge_kernel"]
    assert not out["80"]["record"]["faithful"]  # sm_80 code is not what the package compiles for sm_90
