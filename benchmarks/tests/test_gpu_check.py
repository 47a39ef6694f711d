"""The GPU check's harness, run tiny on the CPU: bytes from the storage model, results written once."""

import json

import pytest

from benchmarks import gpu_check
from reference import PNMixConfig, storage_model


@pytest.mark.interpreter
def test_tiny_run_writes_a_complete_result(tmp_path, capsys):
    assert gpu_check.main(["--tiny", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("gpu-check-*.json")
    data = json.loads(path.read_text())
    assert data["kind"] == "pnmix-gpu-check" and "not predictive" in data["timing"]
    assert {"torch", "triton", "python"} <= set(data["versions"])
    rows = data["decode_attention"]
    assert [(r["batch"], r["context"]) for r in rows] == [(2, 300)]
    for r in rows:
        cache_bytes = storage_model(PNMixConfig(), r["batch"], 8, 128, r["context"]).total
        assert r["pnmix_bytes"] == cache_bytes + 2 * r["batch"] * 32 * 128 * 2  # + q and the output
        assert r["fp16_bytes"] == 2 * r["batch"] * 8 * 300 * 128 * 2 + 2 * r["batch"] * 32 * 128 * 2
        assert r["pnmix_gbps"] == pytest.approx(r["pnmix_bytes"] / (r["pnmix_ms"] * 1e-3) / 1e9)
    assert "written to" in capsys.readouterr().out


def test_without_cuda_and_without_tiny_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out
