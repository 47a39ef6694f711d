"""Sound implementations pass (conformance/meta/sound.py), and every property they claim runs."""

import json

from conformance.meta.test_mutants import run_suite

SOUND = "conformance.meta.sound"


def results(tmp_path, *args: str) -> tuple[int, str, list[dict]]:
    out = tmp_path / "result.json"
    run = run_suite(*args, "--conformance-json", str(out))
    return run.returncode, run.stdout[-3000:], json.loads(out.read_text())["results"] if out.exists() else []


def test_reading_metadata_after_a_write_passes_the_fault_property(tmp_path):
    code, log, got = results(tmp_path, "conformance/test_p10_faults.py", "--impl", f"{SOUND}:late_metadata")
    assert code == 0, log
    (record,) = got
    assert record["outcome"] == "passed" and record["examples"]["run"] > 1, record


def test_an_example_past_the_claimed_head_dims_is_refitted_not_the_property_skipped(tmp_path):
    """The paper's G = 128 fits no claimed head_dim (16, 32): those examples are refitted at smaller
    groups (or dropped one by one); the round trips still run, and the results count them."""
    code, log, got = results(tmp_path, "conformance/test_p1_packing.py", "--impl", f"{SOUND}:small_head_dims")
    assert code == 0, log
    ran = {r["property"]: r for r in got}
    for name in ("test_key_codes_roundtrip", "test_value_codes_roundtrip"):
        assert ran[name]["outcome"] == "passed", ran[name]
        assert ran[name]["examples"]["run"] >= 10, ran[name]["examples"]


def test_a_property_no_case_fits_is_skipped_having_run_nothing(tmp_path):
    code, log, got = results(tmp_path, "conformance/test_p1_packing.py", "--impl", f"{SOUND}:nothing_fits")
    assert code == 0, log
    ran = {r["property"]: r for r in got}
    for name in ("test_key_codes_roundtrip", "test_value_codes_roundtrip"):
        record = ran[name]
        assert record["outcome"] == "skipped" and record["examples"]["run"] == 0, record
        assert record["examples"]["dropped"] > 0 and record["reason"].startswith("no example fits its claims: "), record
        assert "token_multiple 64 exceeds max_tokens 32" in record["reason"], record
