"""Result files: kind from content, clear errors for files the report cannot read."""

import json
from pathlib import Path

import pytest

from reports import inputs

from . import synthetic

COMMITTED_FIDELITY = max((Path(__file__).parents[2] / "benchmarks" / "results").glob("fidelity-*.json"))  # the newest


@pytest.mark.parametrize(
    ("maker", "kind"),
    [(synthetic.conformance, "conformance"), (synthetic.gpu_check, "gpu-check"),
     (synthetic.gpu_benchmarks, "pytest-benchmark"), (synthetic.tiny_benchmarks, "pytest-benchmark")],
)  # fmt: skip
def test_kind_comes_from_the_content_not_the_name(tmp_path, maker, kind):
    path = synthetic.write(tmp_path, "results.json", maker())
    assert inputs.load(path, "--input").kind == kind


def test_committed_fidelity_result_is_recognised():
    source = inputs.load(COMMITTED_FIDELITY, "committed")
    assert source.kind == "fidelity" and source.name == "benchmarks/results/" + COMMITTED_FIDELITY.name


@pytest.mark.parametrize(
    ("content", "says"),
    [(json.dumps({"kind": "something-else"}), "kind 'something-else'"), ("{not json", "cannot read it as JSON")],
)  # fmt: skip
def test_unknown_or_broken_file_fails_naming_the_file(tmp_path, content, says):
    """What counts as unknown content is reference.records.kind_of's (tested there); here: the file is named."""
    path = tmp_path / "mystery.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"mystery\.json") as err:
        inputs.load(path, "--input")
    assert says in str(err.value)


def test_folders_are_read_recursively_and_missing_paths_fail(tmp_path):
    synthetic.write(tmp_path, "a.json", synthetic.conformance())
    (tmp_path / "deeper").mkdir()
    synthetic.write(tmp_path / "deeper", "b.json", synthetic.gpu_check())
    (tmp_path / "notes.md").write_text("not a result")
    assert [s.kind for s in inputs.load_all([tmp_path], "--input")] == ["conformance", "gpu-check"]
    with pytest.raises(ValueError, match=r"--input .*nowhere\.json: no such file"):
        inputs.load_all([tmp_path / "nowhere.json"], "--input")


def test_benchmarks_outside_the_schema_are_named_and_left_out(tmp_path):
    data = synthetic.gpu_benchmarks()
    del data["benchmarks"][0]["extra_info"]["tokens_per_s"]
    source = inputs.load(synthetic.write(tmp_path, "gpu.json", data), "--input")
    problems = inputs.benchmark_problems(source.data)
    assert problems == [f"{data['benchmarks'][0]['name']}: extra_info lacks tokens_per_s"]
    names = {b["name"] for b in inputs.usable(source)}
    assert data["benchmarks"][0]["name"] not in names and len(names) == len(data["benchmarks"]) - 1
    tiny_data = synthetic.tiny_benchmarks()
    tiny = inputs.load(synthetic.write(tmp_path, "tiny.json", tiny_data), "--input")
    assert inputs.benchmark_problems(tiny.data) == []  # fig6-model is computed: known, shown elsewhere
    tiny_data["benchmarks"][0]["extra_info"]["suite"] = "fig8"
    odd = inputs.load(synthetic.write(tmp_path, "odd.json", tiny_data), "--input")
    assert inputs.benchmark_problems(odd.data) == [
        f"{tiny_data['benchmarks'][0]['name']}: extra_info['suite'] is 'fig8', not one of "
        "['fig6-memory', 'fig6c-throughput', 'fig7-latency', 'kernel', 'kernel-launch']"
    ]
    assert [b["scale"] for b in inputs.benchmarks([tiny, source], "fig7-latency", "tiny")] == ["tiny", "tiny"]
    with pytest.raises(ValueError, match="suite must be one of"):
        inputs.benchmarks([source], "fig8")


ROOT = Path(__file__).parents[2]
#: Results committed to the repository (those the report reads by default, and the example report's own):
#: each must pass the schema of its kind.
COMMITTED = sorted(p for d in ("benchmarks/results", "reports/example-cpu/data") for p in (ROOT / d).rglob("*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_results_pass_the_schema_of_their_kind(path):
    source = inputs.load(path, "committed")
    if source.kind == "pytest-benchmark":
        assert inputs.benchmark_problems(source.data) == []


@pytest.mark.parametrize(
    "maker", [synthetic.conformance, synthetic.gpu_check, synthetic.gpu_benchmarks, synthetic.tiny_benchmarks]
)
def test_the_synthetic_results_of_the_tests_pass_the_schema(tmp_path, maker):
    inputs.load(synthetic.write(tmp_path, "r.json", maker()), "--input")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"kind": "pnmix-fidelity"}, ["model: missing", "summary: missing"]),
        ({"kind": "pnmix-long-output"}, ["summary: missing"]),
        ({"kind": "pnmix-role-calibration"}, ["calibration: missing", "allocations: missing"]),
        (
            {**json.loads(COMMITTED_FIDELITY.read_text()), "prompts": "six"},
            ["prompts: is a string ('six'), expected an integer"],
        ),
        (
            {**synthetic.conformance(), "results": [{"implementation": "x", "outcome": 1}] * 3},
            ["results[0].outcome: is an integer (1), expected a string (and in 2 more items)",
             "results[0].module: missing (and in 2 more items)"],
        ),
        (
            {**synthetic.gpu_check(), "steps": {"fig7": {"command": "pytest"}}},
            ["steps.fig7.exit_code: missing", "steps.fig7.seconds: missing"],
        ),
    ],
)  # fmt: skip
def test_a_file_of_a_known_kind_but_wrong_content_is_refused_one_line_per_problem(tmp_path, data, says):
    path = synthetic.write(tmp_path, "odd.json", data)
    with pytest.raises(inputs.InputError) as err:
        inputs.load(path, "--input")
    assert all(line.startswith(f"{path} (") and "\n" not in line for line in err.value.lines)
    problems = [line.split("): ", 1)[1] for line in err.value.lines]
    assert set(says) <= set(problems), problems


def test_every_bad_file_is_named_before_failing(tmp_path):
    synthetic.write(tmp_path, "a.json", {"kind": "pnmix-fidelity"})
    synthetic.write(tmp_path, "b.json", synthetic.conformance())
    synthetic.write(tmp_path, "c.json", {"kind": "pnmix-conformance"})
    with pytest.raises(inputs.InputError) as err:
        inputs.load_all([tmp_path], "--input")
    named = {Path(line.split(" (")[0]).name for line in err.value.lines}
    assert named == {"a.json", "c.json"}


def test_benchmarks_with_figures_of_the_wrong_type_are_named_and_left_out(tmp_path):
    data = synthetic.gpu_benchmarks()
    data["benchmarks"][0]["extra_info"]["tokens_per_s"] = "fast"
    source = inputs.load(synthetic.write(tmp_path, "gpu.json", data), "--input")
    assert inputs.benchmark_problems(source.data) == [
        f"{data['benchmarks'][0]['name']}: extra_info.tokens_per_s: is a string ('fast'), expected a number or null"
    ]
    assert data["benchmarks"][0]["name"] not in {b["name"] for b in inputs.usable(source)}
