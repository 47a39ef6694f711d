"""Currency by what the code does: a result stays current across comments, docstrings, layout and moved
definitions, and goes to History when a definition it measured computes something else (Eq. 7's rounding)."""

import shutil
from pathlib import Path

import pytest

from benchmarks.efficiency import compiled
from reference import records
from reports import currency

QUANT = "reference/equations/quant.py"


def units_of(folder: Path) -> frozenset[str]:
    return frozenset(u for p in sorted(folder.rglob("*.py")) for u in records.code_units(p) or ())


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of this tree's spec, judged in place of the tree (`currency.tree_units`, `records.ROOT`), and
    what a result of the spec records now."""
    code = records.code_fingerprint("reference")
    copy = tmp_path / "reference"
    shutil.copytree(records.ROOT / "reference", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    monkeypatch.setattr(currency, "tree_units", lambda: units_of(copy))
    monkeypatch.setattr(records, "ROOT", tmp_path)
    return copy, code


def test_words_and_layout_change_nothing_a_result_measured(tree):
    tree, code = tree
    path = tree / "equations" / "quant.py"
    text = path.read_text()
    text = text.replace('"""Eq. 7 scale and zero in float32', '"""Eq. 7 (reworded) scale and zero, float32', 1)
    text = text.replace(
        "    return span * 0.5, xmin + span * 0.25",
        "    # the bin midpoints\n    return (span * 0.5, xmin + span * 0.25)",
    )
    path.write_text(text + "\n\n# a trailing comment\n")
    assert records.file_digest(path) != code["files"][QUANT]  # its bytes did change
    assert currency.changed_files(code) == []


def test_a_definition_moved_to_another_file_keeps_the_result_current(tree):
    tree, code = tree
    source = tree / "equations" / "quant.py"
    text = source.read_text()
    start = text.index("def midpoint_params(")
    end = text.index("\ndef ", start + 1)
    (tree / "equations" / "moved.py").write_text("import torch\n\n\n" + text[start:end])
    source.write_text(text[:start] + "from reference.equations.moved import midpoint_params\n" + text[end:])
    assert currency.changed_files(code) == []


def test_changing_eq7s_rounding_sends_the_results_that_used_it_to_history(tree):
    tree, code = tree
    path = tree / "equations" / "quant.py"
    text = path.read_text()
    assert "    return span * 0.5, xmin + span * 0.25" in text
    path.write_text(
        text.replace("    return span * 0.5, xmin + span * 0.25", "    return span * 0.5, xmin + span * 0.3")
    )
    assert currency.changed_files(code) == [QUANT]
    verdict = currency.judge([code])
    assert not verdict.current and f"`{QUANT}`" in verdict.why


def test_a_result_recording_bytes_only_is_judged_by_its_bytes(tree):
    _, code = tree
    code = {k: v for k, v in code.items() if k != "units"}  # a result written before units were recorded
    assert currency.changed_files(code) == []  # judged against this checkout's files, which it matches
    code["files"] = {**code["files"], QUANT: "0" * 16}
    assert currency.changed_files(code) == [QUANT]


def test_a_file_is_fingerprinted_as_first_read_by_this_process(tmp_path):
    path = tmp_path / "late.py"
    path.write_text("X = 1\n")
    first = records._digests(path)
    path.write_text("X = 2\n")  # edited while a long run goes on: the run ran X = 1
    assert records._digests(path) == first and records.code_units(path) != first[1]


# -- kernel timings by their machine code (`benchmarks.efficiency.compiled`) ---------------------------------------

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


def test_a_sections_history_line_counts_refused_files_apart_from_files_of_other_code():
    import types

    from reports.cli import history_note

    older = [types.SimpleNamespace(refused=why) for why in ("summary.kl is 1, its series give 2", None, None)]
    note = history_note(older)
    assert note.startswith("3 result file(s) of this section are listed under History")
    assert "1 refused when read" in note and "2 of code that has changed since" in note
    assert "refused" not in history_note(older[1:])


def test_a_gpu_made_result_whose_canaries_moved_says_whether_its_libraries_or_its_code_differ(monkeypatch):
    """A bfloat16 result of a GPU with another torch: its canaries (CPU, float32 wherever recorded) moved; the
    History line says where it was made and which library differs, not only that the canaries moved."""
    from benchmarks.canaries import behaviour

    monkeypatch.setattr(behaviour, "moved", lambda recorded, pipeline=None: ["PN-Mix (spec cache): floats"])
    here = behaviour.versions()
    data = {
        "dtype": "bfloat16",
        "device_class": "cuda",
        "behaviour": {"canaries": {"method:PN-Mix": {}}, "versions": {**here, "torch": "2.11.0"}},
    }
    why = currency.judge_behaviour(data).why
    assert why.startswith("its canaries moved: PN-Mix (spec cache): floats (made on cuda in bfloat16, with torch")
    assert f"torch 2.11.0 (here {here['torch']})" in why and "move with those libraries" in why
    same = currency.judge_behaviour({**data, "behaviour": {**data["behaviour"], "versions": here}}).why
    assert "(made on cuda in bfloat16; its canaries ran on the CPU in float32 there too" in same
    plain = currency.judge_behaviour({"behaviour": {"canaries": {"method:PN-Mix": {}}, "versions": here}}).why
    assert plain == "its canaries moved: PN-Mix (spec cache): floats"
