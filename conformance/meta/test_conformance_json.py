"""The conformance result file (--conformance-json): refused up front where it cannot be written; for
each failure the property's own words and the failing example as fitted to the claims; skips with
their reason alone; the code judged and the code of each implementation with its claims."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from conformance import loader
from conformance import strategies as cs
from conformance.meta.test_mutants import run_suite
from reference import PNMixConfig
from reference.contract import Capabilities
from reference.records import config_from_record, file_digest, implementation_targets
from reference.tokens.config import TokenPrecisionConfig

ROOT = Path(__file__).parents[2]


def test_an_unwritable_conformance_json_stops_the_run_before_it_starts(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    target = tmp_path / "file" / "result.json"  # unwritable whoever runs the test, root included
    cmd = [sys.executable, "-m", "pytest", "conformance", "--impl", "reference", "--collect-only", "-q"]
    cmd += ["-p", "no:cacheprovider", "--conformance-json", str(target)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and len(said) == 1, said[-30:]
    assert said[0] == f"ERROR: --conformance-json {target}: cannot write there (File exists: {target.parent})"


def parse_example(text: str) -> cs.Case:
    """A recorded example is the repr an @example takes."""
    return eval(text, {"Case": cs.Case, "PNMixConfig": PNMixConfig, "torch": torch})


@settings(max_examples=50, deadline=None)
@given(case=cs.cases())
def test_a_recorded_example_is_the_case_it_names(case):
    text = cs.compact(case)
    assert "\n" not in text and parse_example(text) == case, text


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory) -> dict:
    """Property 7 and the realistic workload on a mutant that leaves out the 1/sqrt(d) of the scores, and on kivi."""
    out = tmp_path_factory.mktemp("p7") / "result.json"
    args = ["conformance/test_p7_attention.py", "conformance/test_p8_storage.py", "-k", "low_precision or realistic"]
    result = run_suite(
        *args, "--impl", "conformance.meta.mutants:unscaled_attention", "--impl", "kivi", "--conformance-json", str(out)
    )
    assert result.returncode == 1, result.stdout[-3000:]
    return json.loads(out.read_text())


def test_a_failure_is_recorded_in_the_property_words_with_its_fitted_example(attention_run):
    (failed,) = [
        r
        for r in attention_run["results"]
        if r["property"] == "test_decode_attention_within_the_low_precision_error" and r["outcome"] == "failed"
    ]
    assert failed["implementation"] == "unscaled_attention"
    reason = failed["reason"]
    assert reason.startswith("AssertionError: attention error ") and " above " in reason, reason
    assert ".py:" not in reason and "\n" not in reason and "Failing" not in reason, reason
    assert "\n" not in failed["example"], failed["example"]
    example = parse_example(failed["example"])
    caps = loader.load("conformance.meta.mutants:unscaled_attention").capabilities
    assert example.fit(caps) == example, f"the example {failed['example']} is not fitted to the claims"
    passed = [r for r in attention_run["results"] if r["outcome"] == "passed"]
    assert passed and all(r["example"] is None for r in passed)


def test_the_realistic_workload_is_measured_even_where_attention_fails(attention_run):
    by = {(r["implementation"], r["property"]): r for r in attention_run["results"]}
    for impl in ("unscaled_attention", "kivi"):
        storage = by[impl, "test_the_realistic_workload_holds_what_it_reports"]["measured"]
        attention = by[impl, "test_the_realistic_workload_attention"]["measured"]
        assert storage["realistic_workload"] == attention["realistic_workload"]
        assert storage["realistic_workload"].startswith("4096 tokens (prompt 3968 then appends of 64, 64)")
        assert "head_dim 128, float16" in storage["realistic_workload"]
        # the configuration is recorded as data beside the sentence: what a reader builds back, not parses
        config = config_from_record(storage["realistic_config"])
        assert (
            storage["realistic_config"] == attention["realistic_config"]
            and cs.compact(config) in (storage["realistic_workload"])
        )
        assert attention["realistic_attention_error"] > 0
        keys, values = storage["realistic_key_bits_per_element"], storage["realistic_value_bits_per_element"]
        assert storage["realistic_bits_per_element"] == pytest.approx((keys + values) / 2)
    # PN-Mix's keys: 3 bits on half the channels, 1 on the rest, plus scales, sinks and residual;
    # KIVI's at 1 bit; both at 2-bit values. The storage test passes: only attention is wrong.
    assert (
        2.25
        < by["unscaled_attention", "test_the_realistic_workload_holds_what_it_reports"]["measured"][
            "realistic_key_bits_per_element"
        ]
        < 3
    )
    assert (
        by["kivi", "test_the_realistic_workload_holds_what_it_reports"]["measured"]["realistic_key_bits_per_element"]
        < 2
    )
    # recorded as a measurement, never as a pass: it judges nothing
    assert by["kivi", "test_the_realistic_workload_holds_what_it_reports"]["outcome"] == "measured"
    assert by["unscaled_attention", "test_the_realistic_workload_attention"]["outcome"] == "failed"
    assert by["kivi", "test_the_realistic_workload_attention"]["outcome"] == "passed"


def test_the_code_judged_and_each_implementation_code_and_claims(attention_run):
    code = attention_run["code"]
    assert code["targets"] == ["conformance", "reference"]
    assert "conformance/plugin.py" in code["files"] and "reference/contract/__init__.py" in code["files"]
    assert not any("/meta/" in path for path in code["files"]), "the suite's own tests are not its code"
    details = {d["name"]: d for d in attention_run["implementation_details"]}
    assert set(details) == {"unscaled_attention", "kivi"}
    assert details["unscaled_attention"]["code"]["targets"] == list(implementation_targets("conformance.meta.mutants"))
    assert details["kivi"]["code"]["targets"] == ["reference"]
    for d in details.values():
        assert d["code"]["commit"] == code["commit"]
        assert all(file_digest(ROOT / path) == digest for path, digest in d["code"]["files"].items())
    claims = details["kivi"]["claims"]
    assert set(claims) == {f.name for f in dataclasses.fields(Capabilities)}
    assert claims["preset"] == "reference.methods.kivi_preset" and claims["residual"] == "sliding_values"
    assert claims["dtypes"] == ["float16", "bfloat16", "float32"]
    assert claims["key_bits"][:2] == [[1, 1], [2, 2]] and claims["token_precision"] == []


# A property of its own, run by the suite's plug-in on kivi: two distinct faults, found and shrunk
# by hypothesis, and a skip from an explicit example.
SYNTHETIC = """
import pytest
import torch
from hypothesis import example, given, settings

from conformance import strategies as cs
from conformance.harness import fitted


@pytest.fixture(scope="session")
def device():
    return torch.device("cpu")


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(case=cs.cases())
def test_two_faults(impl, device, case):
    case = fitted(impl, case, device)
    if case.kv_heads > 1:
        raise ValueError(f"{case.kv_heads} KV heads")
    assert case.prompt < 20, f"a prompt of {case.prompt} tokens"


@given(case=cs.cases())
@example(case=cs.WORKLOAD)
def test_skips(impl, device, case):
    pytest.skip("not for this one")
"""


def test_distinct_failures_each_with_its_shrunk_fitted_example_and_a_bare_skip_reason(tmp_path):
    (tmp_path / "test_synthetic.py").write_text(textwrap.dedent(SYNTHETIC))
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "-q"]
    cmd += ["--rootdir", str(tmp_path), "test_synthetic.py", "--impl", "kivi", "--conformance-json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PNMIX_IMPL", None)
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout[-3000:]
    records = {r["property"]: r for r in json.loads(out.read_text())["results"]}
    skipped = records["test_skips"]
    assert (skipped["outcome"], skipped["reason"], skipped["example"]) == ("skipped", "not for this one", None)
    failed = records["test_two_faults"]
    assert failed["outcome"] == "failed"
    assert sorted(failed["reason"].split(" | ")) == ["AssertionError: a prompt of 20 tokens", "ValueError: 2 KV heads"]
    examples = [parse_example(text) for text in failed["example"].split(" | ")]
    caps = loader.load("kivi").capabilities
    assert len(examples) == 2 and all(e.fit(caps) == e for e in examples), failed["example"]
    # fitted: KIVI's preset made the keys uniform and its claim gave the values a sliding window
    assert all(e.config.b_high == e.config.b_low and e.config.value_residual == "sliding" for e in examples)
    # shrunk: the smallest case of each fault
    assert sorted((e.kv_heads, e.prompt) for e in examples) == [(1, 20), (2, 1)]


SKIPPED_IN_AN_EXAMPLE = """
import pytest
import torch
from hypothesis import example, given

from conformance import strategies as cs
from conformance.harness import fitted


@pytest.fixture(scope="session")
def device():
    return torch.device("cpu")


@given(case=cs.cases())
@example(case=cs.WORKLOAD)
def test_unclaimed(impl, device, case):
    fitted(impl, case, device)
    pytest.skip(f"{impl.name} does not claim this")
"""


def test_a_skip_inside_an_explicit_example_prints_its_reason_not_a_failing_example(tmp_path):
    (tmp_path / "test_unclaimed.py").write_text(textwrap.dedent(SKIPPED_IN_AN_EXAMPLE))
    cmd = [sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "-q", "-rs"]
    cmd += ["--rootdir", str(tmp_path), "test_unclaimed.py", "--impl", "kivi", "--no-conformance-json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PNMIX_IMPL", None)
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "kivi does not claim this" in result.stdout
    assert "explicit example" not in result.stdout and "Fitted to the claims" not in result.stdout, result.stdout


def test_a_per_token_cache_records_bits_and_error_on_the_realistic_workload(tmp_path):
    out = tmp_path / "result.json"
    args = ["conformance/test_p11_token_precision.py", "-k", "realistic", "--impl", "triaxialkv"]
    result = run_suite(*args, "--conformance-json", str(out))
    assert result.returncode == 0, result.stdout[-3000:]
    measured = {}
    for r in json.loads(out.read_text())["results"]:
        measured.update(r["measured"])
    assert "TokenPrecisionConfig(), each token low with chance 50%" in measured["realistic_workload"]
    assert config_from_record(measured["realistic_config"]) == TokenPrecisionConfig()
    assert measured["realistic_low_share"] == 0.5
    assert measured["realistic_workload"].startswith("4096 tokens")
    # INT4 and INT2 tokens in groups of 32 with float16 scales and zeros, half of them low: about 4 bits
    assert 3.5 < measured["realistic_bits_per_element"] < 4.5
    key, value = measured["realistic_key_bits_per_element"], measured["realistic_value_bits_per_element"]
    assert abs((key + value) / 2 - measured["realistic_bits_per_element"]) < 1e-9 and key > value
    assert 0 < measured["realistic_attention_error"] < 1
