"""Each kind of result has one home: the module that writes it states its schema, markdown, canaries and the
checks of its own outcomes (`reference.schema.Kind`); the writer renders what the file holds; the report only
dispatches."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from benchmarks.commands.saving import write_result
from benchmarks.fidelity import equal_bits, long_output
from reference import records
from reports import currency, inputs, schema

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _newest(kind: str) -> Path:
    return sorted(RESULTS.glob(f"{kind}-*.json"))[-1]


def test_every_kind_a_result_file_can_be_has_one_home():
    assert set(schema.KINDS) == set(records.KINDS)
    for name, kind in schema.KINDS.items():
        assert kind.name == name
    # the canaries the report judges currency by are the kinds' own, each measurement kind's under its name
    assert currency.PIPELINES == schema.PIPELINES
    assert currency.BEHAVIOUR_KINDS <= set(schema.PIPELINES)


def _writes(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "write_result"
    ]


def test_each_tool_writes_its_results_through_the_kind_it_defines():
    """A tool's `write_result` call names the module's own `KIND`, and that kind is the report's: the writer,
    the schema and the markdown cannot drift apart in two places."""
    homes = {}
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        calls = [c for c in _writes(path) if "tests" not in path.parts and path.name != "saving.py"]
        if not calls:
            continue
        for call in calls:
            assert isinstance(call.args[2], ast.Name) and call.args[2].id == "KIND", f"{path}:{call.lineno}"
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        homes[module] = __import__(module, fromlist=["KIND"]).KIND
    assert len(homes) == 5  # fidelity, long outputs, equal bits, role calibration, task accuracy
    for module, kind in homes.items():
        assert schema.KINDS[kind.name] is kind, module
        assert kind.render is not None and kind.name in kind.pipeline, module


def test_a_written_result_renders_as_its_file_reads(tmp_path, capsys):
    """The markdown written beside a result is the markdown of the result as its file holds it (keys sorted):
    a reader rendering the file gets the same text, whatever order the tool built its record in."""
    data = json.loads(_newest("long-output").read_text())
    methods = data["summary"]["methods"]
    data["summary"]["methods"] = dict(reversed(methods.items()))  # the order a tool might build it in
    path = write_result("pnmix-long-output", tmp_path, long_output.KIND, data)
    again = json.loads(path.read_text())
    written = path.with_suffix(".md").read_text()
    assert written == long_output.KIND.render(again)
    assert written != long_output.markdown(data)  # the order it was built in would render otherwise
    assert written.strip() in capsys.readouterr().out


def test_a_result_its_readers_cannot_read_is_written_and_said(tmp_path, capsys):
    """A record that departs from its kind's schema is still written (a measurement is not lost to a fault of
    its record), and the tool says which field the report will refuse."""
    data = json.loads(_newest("equal-bits").read_text())
    data["results"][0]["memory"] = [m for m in data["results"][0]["memory"] if m["method"] != "FP16"]
    path = write_result("pnmix-equal-bits", tmp_path, equal_bits.KIND, data)
    assert path.is_file() and path.with_suffix(".md").is_file()
    err = capsys.readouterr().err
    assert "pnmix-equal-bits: warning: the report cannot read this result: results[0].memory: lacks FP16" in err
    with pytest.raises(inputs.InputError, match=r"results\[0\]\.memory: lacks FP16"):
        inputs.load_all([tmp_path], "--input")


def test_the_report_shows_the_tools_own_equal_bits_tables():
    """The report's equal-bits tables are the tool's (`equal_bits.tables`), not a second drawing of them."""
    from reports.sections import equal_bits as section

    source = inputs.load(_newest("equal-bits"), "committed")

    def value(cell: object) -> object:  # a number as tabulate prints it ("16.000" as 16)
        try:
            return float(str(cell))
        except ValueError:
            return str(cell).strip()

    shown = [
        [value(cell) for cell in line.strip().strip("|").split("|")]
        for line in section.render([source]).body.split("\n")
        if line.startswith("|")
    ]
    for r in source.data["results"]:
        for rows in equal_bits.tables(r).values():
            for row in rows:
                assert [value(x) for x in row] in shown, row
