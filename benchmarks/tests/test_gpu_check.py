"""The GPU check's harness, run tiny on the CPU: bytes from the storage model, results written once."""

import json

import pytest

from benchmarks import gpu_check
from reference import storage_model
from reference.methods import METHODS


@pytest.mark.interpreter
def test_tiny_run_writes_a_complete_result(tmp_path, capsys):
    assert gpu_check.main(["--tiny", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("gpu-check-*.json")
    data = json.loads(path.read_text())
    assert data["kind"] == "pnmix-gpu-check" and "not predictive" in data["timing"]
    assert {"torch", "triton", "python"} <= set(data["versions"])
    rows = data["decode_attention"]
    assert [(r["method"], r["batch"], r["context"]) for r in rows] == [
        ("PN-Mix", 2, 300), ("KIVI-2", 2, 300), ("Kitty", 2, 300), ("FP16 (SDPA)", 2, 300)
    ]  # fmt: skip
    assert data["layer"] == {"kv_heads": 2, "query_heads_per_kv_head": 2, "head_dim": 64}
    q_and_out = 2 * 2 * 4 * 64 * 2
    for r in rows:
        if r["method"] == "FP16 (SDPA)":
            assert r["bytes"] == 2 * 2 * 2 * 300 * 64 * 2 + q_and_out
        else:
            assert r["bytes"] == storage_model(METHODS[r["method"]](), 2, 2, 64, 300).total + q_and_out
        assert r["gbps"] == pytest.approx(r["bytes"] / (r["ms"] * 1e-3) / 1e9)
        assert r["fraction_of_copy"] == pytest.approx(r["gbps"] / data["copy_gbps"])
    assert "written to" in capsys.readouterr().out


def test_without_cuda_and_without_tiny_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out
