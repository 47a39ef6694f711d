"""The fidelity CLI's smoke run on the real model: every analysis present, numbers sane and traceable."""

import json

import pytest

from benchmarks.fidelity import analyses as fidelity

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.long]


def test_smoke_run_writes_consistent_results(tmp_path):
    assert fidelity.main(["--smoke", "--out", str(tmp_path)]) == 0
    (json_path,) = tmp_path.glob("fidelity-*.json")
    (md_path,) = tmp_path.glob("fidelity-*.md")
    data = json.loads(json_path.read_text())
    s = data["summary"]
    assert data["prompts"] == 1 and data["new_tokens"] == 24 and data["prompt_tokens"] > 0
    shares = [s["fig5_share_median"][p] for p in ("10", "30", "50")]
    assert 0 < shares[0] <= shares[1] <= shares[2] <= 1
    assert len(s["fig4_jaccard_mean"]) == 4 * 2 * 2 and all(0 <= v <= 1 for v in s["fig4_jaccard_mean"].values())
    assert len(s["table9_mean"]) == 2 + 4 * 2
    assert all(v["mse"] > 0 and v["kl"] >= 0 for v in s["table9_mean"].values())  # small pages: keys quantized
    assert all(0 <= v <= 1 for ref in s["table11_overlap_mean"].values() for v in ref.values())
    e2e = data["end_to_end"]
    assert set(e2e["methods"]) == {"KIVI-2 +32 sinks", "Kitty", "PN-Mix"}
    assert all(0 <= m["identical_fraction"][0] <= 1 and m["nll"] > 0 for m in e2e["methods"].values())
    md = md_path.read_text()
    assert f"FP16 NLL {e2e['fp16_nll']:.4f}" in md and md.count("Paper (quoted)") == md.count("Here (measured)") == 4
    kivi = s["table9_mean"]["KIVI-style uniform 2-bit"]
    assert f"{kivi['mse']:.4g}" in md
