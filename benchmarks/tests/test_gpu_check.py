"""The GPU session command, run at tiny scale on the CPU: what it runs and what it keeps."""

import json

from benchmarks import gpu_check
from reference.records import device_name


def test_tiny_run_keeps_the_benchmark_json_and_a_record_of_each_step(tmp_path, capsys):
    assert gpu_check.main(["--tiny", "--suites", "kernels", "--out", str(tmp_path)]) == 0
    (record_path,) = tmp_path.glob("gpu-check-*.json")
    record = json.loads(record_path.read_text())
    assert record["kind"] == "pnmix-gpu-check" and {"torch", "triton", "python"} <= set(record["versions"])
    assert record["device"] == device_name() and "TRITON_INTERPRET" in record["machine"]  # the device it ran on
    step = record["steps"]["benchmarks"]
    assert step["exit_code"] == 0 and "--bench-scale tiny" in step["command"] and "conformance" not in record["steps"]
    bench = json.loads((tmp_path / step["json"].split("/")[-1]).read_text())
    infos = [b["extra_info"] for b in bench["benchmarks"]]
    assert {i["method"] for i in infos} == {"FP16", "PN-Mix"} and all(i["suite"] == "kernel" for i in infos)
    assert all(i["scale"] == "tiny" and "not predictive" in i["timing"] for i in infos)
    assert "written to" in capsys.readouterr().out


def test_without_cuda_and_without_tiny_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out
