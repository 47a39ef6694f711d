"""Page 1 says what GPU evidence exists, current or under History, and what it found."""

from __future__ import annotations

from reports import cli, inputs
from reports.currency import Verdict
from reports.sections import gpu_evidence
from reports.tests import synthetic


def load(tmp_path, name, data):
    return inputs.load(synthetic.write(tmp_path, name, data), "--input")


def test_without_a_gpu_file_it_says_there_is_none_and_that_speed_is_predicted(tmp_path):
    cpu = load(tmp_path, "c.json", {**synthetic.conformance(), "device": "cpu (x86_64)"})
    text = gpu_evidence.render([cpu], [])
    assert text.startswith("**GPU evidence**: none.") and "predicted by the gate" in text


def test_a_current_gpu_timing_is_said_with_its_device_day_and_finding(tmp_path):
    bench = load(tmp_path, "b.json", synthetic.gpu_benchmarks())
    text = gpu_evidence.render([bench], [])
    k = synthetic.KERNEL
    ratio = k[("PN-Mix", 1, 8192)] / k[("FP16", 1, 8192)]
    assert f"- {synthetic.DEVICE}, 2026-12-01, 1 file(s), current. Found: " in text
    assert f"PN-Mix {ratio:.2f}x FP16's time (B = 1, 8192 tokens" in text and "predicted" not in text


def test_gpu_files_under_history_are_said_with_why_and_what_they_found(tmp_path):
    gpu = load(tmp_path, "c.json", {**synthetic.conformance(), "device": "NVIDIA H200"})
    text = gpu_evidence.render([], [(gpu, Verdict(False, "the code it measured has changed", "abc"))])
    line = next(x for x in text.splitlines() if x.startswith("- NVIDIA H200"))
    assert "under History, not compared. Why: the code it measured has changed." in line
    assert "triton FAILS P1 a" in line and "predicted by the gate" in text  # nothing current: the gate's word


def test_the_reports_first_page_carries_it(tmp_path):
    old = synthetic.gpu_benchmarks()  # records no code fingerprint: History
    path = synthetic.write(tmp_path, "gpu.json", old)
    argv = ["--out-dir", str(tmp_path), "--name", "r", "--no-committed-results", "--no-conformance"]
    argv += ["--no-benchmarks", "--fidelity", "off", "--input", str(path)]
    assert cli.main(argv) == 0
    page1 = (tmp_path / "r" / "REPORT.md").read_text().split("\n## 1. Summary")[1].split("\n## 2. ")[0]
    line = next(x for x in page1.splitlines() if x.startswith(f"- {synthetic.DEVICE}"))
    assert "under History" in line and "FP16's time" in line
