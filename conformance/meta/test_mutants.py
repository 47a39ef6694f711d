"""Every deliberately broken implementation must be caught by the property written for it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (mutant factory in conformance.meta.mutants, property module, the test that must fail)
MUTANTS = [
    ("one_bit_group_ends", "test_p2_midpoint.py", "test_one_bit_channels_reconstruct_to_the_nearer_bin_midpoint"),
    ("quantized_sinks", "test_p3_sinks.py", "test_sink_tokens_are_bit_identical"),
    ("mask_recomputed", "test_p4_mask.py", "test_mask_never_changes_after_prefill"),
    ("wrong_gqa", "test_p4_mask.py", "test_mask_is_the_reference_prefill_selection"),
    ("wrong_gqa", "test_p7_attention.py", "test_decode_attention_within_the_low_precision_error"),
    ("storage_omits_mask", "test_p8_storage.py", "test_storage_report_is_exact"),
    ("storage_omits_mask", "test_p8_storage.py", "test_storage_report_counts_the_tensors_held"),
    ("accepts_nan", "test_p9_bad_input.py", "test_bad_append_is_rejected_and_changes_nothing"),
    ("unscaled_attention", "test_p7_attention.py", "test_decode_attention_within_the_low_precision_error"),
    ("msb_first_keys", "test_p1_packing.py", "test_key_codes_roundtrip_and_match_reference_bytes"),
]


def run_suite(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PNMIX_HYPOTHESIS_PROFILE": "ci"}
    env.pop("PNMIX_IMPL", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEx", "--device", "cpu", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(("mutant", "module", "test"), MUTANTS, ids=[f"{m}-{t}" for m, _, t in MUTANTS])
def test_mutant_is_caught(mutant, module, test):
    result = run_suite(f"conformance/{module}", "--impl", f"conformance.meta.mutants:{mutant}", "--no-conformance-json")
    failed = f"FAILED conformance/{module}::{test}[{mutant}]"
    print(result.stdout[-3000:])
    assert result.returncode == 1, f"the suite did not fail on {mutant} (exit {result.returncode})"
    assert failed in result.stdout, f"{test} did not catch {mutant}"


def test_known_failures_results_file_and_no_overwrite(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(
        "conformance/test_p9_bad_input.py::test_bad_append_is_rejected_and_changes_nothing  # NaN accepted\n"
        "conformance/test_p9_bad_input.py::test_no_such_property\n"
    )
    out = tmp_path / "result.json"
    args = ["conformance/test_p9_bad_input.py", "--impl", "conformance.meta.mutants:accepts_nan"]
    result = run_suite(*args, "--xfails", str(xfails), "--conformance-json", str(out))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "matches no collected test: conformance/test_p9_bad_input.py::test_no_such_property" in result.stdout
    data = json.loads(out.read_text())
    assert data["implementations"] == ["accepts_nan"]
    outcomes = {r["property"]: r["outcome"] for r in data["results"]}
    assert outcomes == {
        "test_bad_append_is_rejected_and_changes_nothing": "xfailed",
        "test_bad_prefill_is_rejected": "passed",
        "test_bad_query_is_rejected_and_changes_nothing": "passed",
    }
    xfailed = next(r for r in data["results"] if r["outcome"] == "xfailed")
    assert xfailed["reason"] == "NaN accepted"
    before = out.read_text()
    again = run_suite(*args, "--conformance-json", str(out))
    assert again.returncode == 4 and "never overwritten" in again.stderr
    assert out.read_text() == before
