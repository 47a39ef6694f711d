"""Every deliberately broken implementation must be caught by the property written for it.

The suite runs once, in one subprocess, against every mutant (conformance/meta/mutants.py),
each on the property modules that target it. This module is also loaded into that run as a
plug-in (`-p conformance.meta.test_mutants`), where `pytest_runtest_makereport` records the
class of each exception a test raises and the repository file that raised it, as junitxml
properties. A mutant is caught when the property written for it fails with its own verdict:
an AssertionError raised in the property's module (pytest's `Failed`, "DID NOT RAISE", where
the property checks with `pytest.raises`). Any other error, e.g. a TypeError of a mutant that
no longer fits the reference, is a crash: the property never judged the defect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import pytest

from conformance.plugin import leaves

ROOT = Path(__file__).resolve().parents[2]

# (mutant factory in conformance.meta.mutants, property module, the test that must catch it)
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
    ("msb_first_keys", "test_p1_packing.py", "test_key_bytes_are_the_reference_layout"),
    ("round_half_even", "test_p5_codes.py", "test_codes_and_scales_are_the_reference_numerics"),
    ("round_half_even", "test_p2_midpoint.py", "test_one_bit_channels_reconstruct_to_the_nearer_bin_midpoint"),
    ("attention_without_upcast", "test_p7_attention.py", "test_decode_attention_within_the_low_precision_error"),
    ("attention_without_upcast", "test_p7_attention.py", "test_attention_is_finite_wherever_the_spec_is"),
    ("shares_its_residual", "test_p9_bad_input.py", "test_editing_what_it_returns_changes_nothing"),
    ("values_flushed_with_keys", "test_p6_residual.py", "test_residual_holds_the_newest_tokens_and_flushes_at_n"),
    ("every_token_low", "test_p11_token_precision.py", "test_every_token_is_held_at_its_precision"),
    ("storage_hides_class_map", "test_p11_token_precision.py", "test_storage_is_the_accounting"),
    ("token_bits_unchecked", "test_p11_token_precision.py", "test_bad_token_bits_are_refused_and_change_nothing"),
    ("no_rollback", "test_p11_token_precision.py", "test_a_fault_leaves_the_cache_as_it_was"),
    # A defect of one combination (3-bit groups, float32 scales) that the drawn cases rarely reach:
    # caught by the explicit examples of every claimed combination.
    ("truncates_rare_combination", "test_p5_codes.py", "test_quantized_tokens_reconstruct_within_half_a_step"),
    # The common workload's attention keeps the verdicts of the property it belongs to (its storage is
    # measured, not judged: test_storage_report_counts_the_tensors_held judges it).
    ("wrong_gqa", "test_p7_attention.py", "test_the_common_workload_attention"),
    ("unscaled_attention", "test_p7_attention.py", "test_the_common_workload_attention"),
    ("unscaled_attention", "test_p7_attention.py", "test_the_realistic_workload_attention"),
]
#: The exception a property fails with when it judges a defect: its own assert, or pytest.raises' "DID NOT RAISE".
VERDICTS = ("AssertionError", "Failed")


def run_suite(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PNMIX_HYPOTHESIS_PROFILE": "ci"}
    env.pop("PNMIX_IMPL", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEx", "--device", "cpu", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


# -- the plug-in loaded into the suite run by `suite_on_mutants` --------------------------------


def _raised_in(exc: BaseException) -> str:
    """The innermost repository file (outside the virtualenv) on exc's traceback, relative to ROOT."""
    where = "?"
    tb = exc.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename).resolve()
        if path.is_relative_to(ROOT) and not path.is_relative_to(Path(sys.prefix).resolve()):
            where = path.relative_to(ROOT).as_posix()
        tb = tb.tb_next
    return where


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    """(Active only in the suite run with -p conformance.meta.test_mutants.) Record the
    implementation as a junitxml property "impl", and each exception the test raised as a
    property "raised": "<class> <file>"."""
    callspec = getattr(item, "callspec", None)
    if call.when == "setup" and callspec is not None and "impl" in callspec.params:
        item.user_properties.append(("impl", callspec.params["impl"].name))
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        for exc in leaves(call.excinfo.value):
            item.user_properties.append(("raised", f"{type(exc).__name__} {_raised_in(exc)}"))


# -- the meta tests ------------------------------------------------------------------------------


class Outcome(NamedTuple):
    """One test of one mutant: passed, failed, error or skipped, and the (class, file) it raised."""

    outcome: str
    raised: tuple[tuple[str, str], ...]


#: How the outcomes of one property's parametrizations (e.g. each bad input kind) combine.
_WORST = ("error", "failed", "passed", "skipped")


def read_junitxml(path: Path) -> dict[tuple[str, str, str], Outcome]:
    """(implementation, module file name, test) -> Outcome, from a junitxml written with the plug-in;
    a test parametrized beyond the implementation has its worst outcome and every exception raised."""
    results: dict[tuple[str, str, str], Outcome] = {}
    for case in ET.parse(path).iter("testcase"):
        test = case.get("name").partition("[")[0]
        props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        impl = next((value for name, value in props if name == "impl"), "?")
        module = case.get("classname").rpartition(".")[2] + ".py"
        found = [tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[found[0]] if found else "passed"
        raised = tuple(tuple(value.split(" ", 1)) for name, value in props if name == "raised")
        key = (impl, module, test)
        if key in results:
            before = results[key]
            outcome = min(outcome, before.outcome, key=_WORST.index)
            raised = before.raised + raised
        results[key] = Outcome(outcome, raised)
    return results


@pytest.fixture(scope="module")
def suite_on_mutants(tmp_path_factory) -> dict[tuple[str, str, str], Outcome]:
    """The suite run once on every mutant, each on the modules of the properties that target it."""
    modules = {}
    for mutant, module, _ in MUTANTS:
        modules.setdefault(mutant, []).append(module)
    impls = [arg for mutant in modules for arg in ("--impl", f"conformance.meta.mutants:{mutant}")]
    select = " or ".join(
        f"({mutant} and ({' or '.join(Path(m).stem for m in dict.fromkeys(ms))}))" for mutant, ms in modules.items()
    )
    paths = [f"conformance/{m}" for m in sorted({m for ms in modules.values() for m in ms})]
    xml = tmp_path_factory.mktemp("mutants") / "junit.xml"
    plugin = ["-p", "conformance.meta.test_mutants", "--junitxml", str(xml)]
    result = run_suite(*paths, *impls, "-k", select, *plugin, "--no-conformance-json")
    print(result.stdout[-5000:], result.stderr[-2000:])
    assert result.returncode == 1, f"the suite run on the mutants exited {result.returncode}, expected 1 (failures)"
    results = read_junitxml(xml)
    assert {impl for impl, _, _ in results} == set(modules), "the run did not cover exactly the mutants"
    return results


@pytest.mark.parametrize(("mutant", "module", "test"), MUTANTS, ids=[f"{m}-{t}" for m, _, t in MUTANTS])
def test_mutant_is_caught(suite_on_mutants, mutant, module, test):
    got = suite_on_mutants.get((mutant, module, test))
    assert got is not None, f"conformance/{module}::{test} did not run on {mutant}"
    assert got.outcome == "failed", f"{test} did not catch {mutant}: {got.outcome}"
    verdicts = [(cls, where) for cls, where in got.raised if cls in VERDICTS and where == f"conformance/{module}"]
    assert got.raised and verdicts == list(got.raised), (
        f"{test} failed on {mutant} with {got.raised}, not only its own assertion: the mutant crashed"
    )


def test_mutants_pass_the_other_properties(suite_on_mutants):
    """In the modules run, every property not written for a mutant passes (or is skipped) on it:
    a mutant carries one defect and otherwise behaves like the reference."""
    targeted = set(MUTANTS)
    others = {key: got for key, got in suite_on_mutants.items() if key not in targeted}
    assert others, "no other property ran"
    wrong = {f"{impl}: {module}::{test}": got for (impl, module, test), got in others.items()}
    wrong = {name: got for name, got in wrong.items() if got.outcome not in ("passed", "skipped")}
    assert not wrong, f"properties not written for these mutants did not pass: {wrong}"


def test_known_failures_results_file_and_no_overwrite(tmp_path):
    append = "conformance/test_p9_bad_input.py::test_bad_append_is_rejected_and_changes_nothing"
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(
        f"{append}[accepts_nan-nan_in_k]  # NaN accepted\n"
        f"{append}[accepts_nan-inf_in_v]  # Inf accepted\n"
        "conformance/test_p9_bad_input.py::test_no_such_property\n"
    )
    out = tmp_path / "result.json"
    args = ["conformance/test_p9_bad_input.py", "--impl", "conformance.meta.mutants:accepts_nan"]
    result = run_suite(*args, "--xfails", str(xfails), "--conformance-json", str(out))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "matches no collected test: conformance/test_p9_bad_input.py::test_no_such_property" in result.stdout
    data = json.loads(out.read_text())
    assert data["implementations"] == ["accepts_nan"]
    assert data["implementation_details"][0]["origin"] == "conformance.meta.mutants:accepts_nan"
    outcomes = {r["nodeid"].partition("::")[2]: r["outcome"] for r in data["results"]}
    append = append.partition("::")[2]
    assert (
        outcomes.pop(f"{append}[accepts_nan-nan_in_k]") == outcomes.pop(f"{append}[accepts_nan-inf_in_v]") == "xfailed"
    )
    assert set(outcomes.values()) == {"passed"} and len(outcomes) == 21  # the other 7 + 9 + 4 kinds, edits
    reasons = {r["reason"] for r in data["results"] if r["outcome"] == "xfailed"}
    assert reasons == {"NaN accepted", "Inf accepted"}
    before = out.read_text()
    again = run_suite(*args, "--conformance-json", str(out))
    assert again.returncode == 4 and "never overwritten" in again.stderr
    assert out.read_text() == before


def test_failures_are_recorded_with_their_message_and_case(tmp_path):
    """A result file says what failed in the property's own words and on which fitted case."""
    out = tmp_path / "result.json"
    args = ["conformance/test_p9_bad_input.py", "-k", "nan_in_k", "--impl", "conformance.meta.mutants:accepts_nan"]
    result = run_suite(*args, "--conformance-json", str(out))
    assert result.returncode == 1, result.stdout[-3000:]
    (failed,) = [r for r in json.loads(out.read_text())["results"] if r["outcome"] == "failed"]
    assert failed["reason"].startswith("Failed: DID NOT RAISE"), failed["reason"]
    assert failed["example"].startswith("Case(PNMixConfig("), failed["example"]
