"""A kernel timing's machine-code record: faithful only where compiling ahead of time reproduces the kernels that
ran; the report keeps such a timing current while its kernels compile to the same SASS, whatever the source says,
and sends it to History naming the kernel when they do not (`reports.currency.judge_timing`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.efficiency import compiled
from pnmix import _runtime, aot, sass
from reports import currency

needs_tools = pytest.mark.skipif(isinstance(sass.toolchain(), str), reason=f"toolchain absent: {sass.toolchain()}")
CASE, TARGET = aot.Case("PN-Mix", "float16", 128, 4), _runtime.Target(90, 132)
STALE_CODE = {"files": {"pnmix/kernels/attention.py": "0" * 64}, "commit": "abc1234"}  # no longer this tree's


def point(rec: dict | None) -> dict:
    """A benchmark point whose code fingerprint says its source changed."""
    return {"name": "p", "extra_info": {"code": STALE_CODE, **({"compiled": rec} if rec is not None else {})}}


def faithful_record(ran: dict) -> dict:
    return {
        "case": {"method": "PN-Mix", "dtype": "float16", "head_dim": 128, "gqa": 4},
        "target": {"arch": 90, "sms": 132},
        "ptx_unpack": False,
        "ran": ran,
        "compiled_ahead": ran,
        "faithful": True,
    }


def test_nothing_is_recorded_off_a_gpu():
    ran = [("_split_kernel", None)]
    assert "why" in compiled.record("PN-Mix", (2, 4, 128), torch.float16, ran, torch.device("cpu"))


@pytest.mark.parametrize(
    "change",
    [
        {"faithful": False},
        {"compiled_ahead": {"_split_kernel": ["b" * 64]}},  # claims faithful, but the two differ
        {"ran": {}, "compiled_ahead": {}},
        {"case": None},
    ],
)
def test_a_record_that_does_not_reproduce_what_ran_cannot_decide(change):
    rec = {**faithful_record({"_split_kernel": ["a" * 64]}), **change}
    rec = {k: v for k, v in rec.items() if v is not None}
    assert not compiled.faithful(rec)
    verdict = currency.judge_timing(point(rec))
    assert not verdict.current and "pnmix/kernels/attention.py" in verdict.why  # the code fingerprint decides


def test_same_machine_code_keeps_a_timing_current_and_other_code_names_the_kernel(monkeypatch):
    here = {"_merge_kernel": ["m" * 64], "_split_kernel": ["s" * 64]}
    monkeypatch.setattr(compiled, "_here", lambda spec: here)
    assert currency.judge_timing(point(faithful_record(dict(here)))).current  # though its source changed
    moved = currency.judge_timing(point(faithful_record({**here, "_split_kernel": ["t" * 64]})))
    assert not moved.current and "_split_kernel (sm_90)" in moved.why and "_merge_kernel" not in moved.why


def test_a_machine_that_cannot_compile_falls_back_to_the_code(monkeypatch):
    monkeypatch.setattr(compiled, "_here", lambda spec: "not found: ptxas")
    verdict = currency.judge_timing(point(faithful_record({"_split_kernel": ["s" * 64]})))
    assert not verdict.current and "pnmix/kernels/attention.py" in verdict.why


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
    assert rec["faithful"] and compiled.faithful(rec) and out["90"]["moved"] == [], rec
    assert list(rec["ran"]) == ["_merge_kernel"]
    assert not out["80"]["record"]["faithful"]  # sm_80 code is not what the package compiles for sm_90
