"""Result files: kind from content, clear errors for files the report cannot read."""

import json
import math
import re
from pathlib import Path

import pytest

from reference import records
from reports import inputs
from reports.tests import synthetic

COMMITTED_FIDELITY = max((Path(__file__).parents[2] / "benchmarks" / "results").glob("fidelity-*.json"))  # the newest


@pytest.mark.parametrize(
    ("maker", "kind"),
    [
        (synthetic.conformance, "conformance"),
        (synthetic.gpu_check, "gpu-check"),
        (synthetic.gpu_benchmarks, "pytest-benchmark"),
        (synthetic.tiny_benchmarks, "pytest-benchmark"),
    ],
)
def test_kind_comes_from_the_content_not_the_name(tmp_path, maker, kind):
    path = synthetic.write(tmp_path, "results.json", maker())
    assert inputs.load(path, "--input").kind == kind


def test_committed_fidelity_result_is_recognised():
    source = inputs.load(COMMITTED_FIDELITY, "committed")
    assert source.kind == "fidelity" and source.name == "benchmarks/results/" + COMMITTED_FIDELITY.name


@pytest.mark.parametrize(
    ("content", "says"),
    [(json.dumps({"kind": "something-else"}), "kind 'something-else'"), ("{not json", "cannot read it as JSON")],
)
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
        "['eval-speed', 'fig6-memory', 'fig6c-throughput', 'fig7-latency', 'kernel', 'kernel-fragment', "
        "'kernel-launch', 'kernel-ptx']"
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
    assert source.refused == ""  # its aggregates and verdicts are what its own outcomes give
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
            ["prompts: is a string ('six'), expected an integer in [1, 16777216]"],
        ),
        (
            {**synthetic.conformance(), "results": [{"implementation": "x", "outcome": 1}] * 3},
            [
                "results[0].outcome: is an integer (1), expected one of 'passed', 'failed', 'skipped', 'xfailed', "
                "'xpassed', 'measured' (and in 2 more items)",
                "results[0].module: missing (and in 2 more items)",
            ],
        ),
        (
            {**synthetic.gpu_check(), "steps": {"fig7": {"command": "pytest"}}},
            ["steps.fig7.exit_code: missing", "steps.fig7.seconds: missing"],
        ),
    ],
)
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


# -- values out of range, and files that are not JSON: one line each, naming the file and the field --

RESULTS = ROOT / "benchmarks" / "results"
#: A valid result of each kind, by the name the probes use.
VALID = {
    "gpu": synthetic.gpu_benchmarks,
    "tiny": synthetic.tiny_benchmarks,
    "conformance": synthetic.conformance,
    "gpu-check": synthetic.gpu_check,
    "task-accuracy": synthetic.task_accuracy,
    "fidelity": lambda: json.loads(COMMITTED_FIDELITY.read_text()),
    "long-output": lambda: json.loads(
        min(RESULTS.glob("long-output-*.json"), key=lambda p: p.stat().st_size).read_text()
    ),
    "equal-bits": lambda: json.loads(max(RESULTS.glob("equal-bits-*.json")).read_text()),
    "role-calibration": lambda: json.loads(max(RESULTS.glob("role-calibration-*.json")).read_text()),
}
_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]|\['([^']*)'\]|\[(\w+)=([\w-]+)\]")
#: (result, field as the error names it, value written there, the problem the one line says). A field that
#: the report reads gets its probe by a row here; [suite=kernel] stands for the first benchmark of that suite.
BAD_VALUES = [
    (
        "gpu",
        "benchmarks[suite=kernel].extra_info.gbps",
        math.inf,
        "is a number (inf), expected a finite number in (0, 1000000] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=kernel].extra_info.bytes",
        -1,
        "is an integer (-1), expected an integer in [1, 1125899906842624] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=kernel].extra_info.context",
        0,
        "is an integer (0), expected an integer in [1, 16777216]",
    ),
    (
        "gpu",
        "benchmarks[suite=kernel].extra_info.copy_gbps",
        None,
        "is null (None), expected a finite number in (0, 1000000]",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6c-throughput].extra_info.batch",
        -5,
        "is an integer (-5), expected an integer in [1, 1048576]",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6c-throughput].extra_info.batch",
        0,
        "is an integer (0), expected an integer in [1, 1048576]",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6c-throughput].extra_info.batch",
        10**30,
        "is an integer (1000000000000000000000000000000), expected an integer in [1, 1048576]",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6c-throughput].extra_info.batch",
        math.nan,
        "is a number (nan), expected an integer in [1, 1048576]",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6c-throughput].extra_info.tokens_per_s",
        -math.inf,
        "is a number (-inf), expected a finite number in (0, 1000000000] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6c-throughput].extra_info.prompt",
        -141,
        "is an integer (-141), expected an integer in [0, 16777216]",
    ),
    (
        "gpu",
        "benchmarks[suite=fig7-latency].extra_info.step_ms",
        0.0,
        "is a number (0.0), expected a finite number in (0, 604800000] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=fig7-latency].extra_info.step_ms",
        None,
        "is null at a full-scale point that ran (neither out of memory nor a launch choice that does not fit): "
        "expected a number",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6-memory].extra_info.peak_allocated_gib",
        -1.0,
        "is a number (-1.0), expected a finite number in [0, 1048576] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6-memory].extra_info.budget_gib",
        math.nan,
        "is a number (nan), expected a finite number in [0, 1048576] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=fig6-memory].extra_info.budget_gib",
        math.inf,
        "is a number (inf), expected a finite number in [0, 1048576] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=kernel-launch].extra_info.warps",
        0,
        "is an integer (0), expected an integer in [1, 65536]",
    ),
    (
        "gpu",
        "benchmarks[suite=kernel].stats.median",
        math.nan,
        "is a number (nan), expected a finite number in [0, 604800] or null",
    ),
    (
        "gpu",
        "benchmarks[suite=kernel].extra_info.gbps",
        "fast",
        "is a string ('fast'), expected a finite number in (0, 1000000] or null",
    ),
    (
        "tiny",
        "benchmarks[suite=fig7-latency].extra_info.step_ms",
        -1.0,
        "is a number (-1.0), expected a finite number in (0, 604800000] or null",
    ),
    (
        "conformance",
        "results[0].outcome",
        "exploded",
        "is a string ('exploded'), expected one of 'passed', 'failed', 'skipped', 'xfailed', 'xpassed', 'measured'",
    ),
    ("conformance", "results[0].duration_s", -1, "is an integer (-1), expected a finite number in [0, 604800]"),
    ("conformance", "device", "cpu \ud800", "is a string that is not valid Unicode (a string ('cpu \\ud800'))"),
    (
        "gpu-check",
        "steps.benchmarks.seconds",
        math.nan,
        "is a number (nan), expected a finite number in [0, 604800] or null",
    ),
    (
        "gpu-check",
        "steps.benchmarks.exit_code",
        1000,
        "is an integer (1000), expected an integer in [-255, 255] or null",
    ),
    ("fidelity", "prompts", 0, "is an integer (0), expected an integer in [1, 16777216]"),
    ("fidelity", "summary.fig5_share_median['10']", 1.5, "is a number (1.5), expected a finite number in [0, 1]"),
    (
        "fidelity",
        "summary.table9_mean['KIVI-style uniform 2-bit'].kl",
        math.nan,
        "is a number (nan), expected a finite number >= -1e-06",
    ),
    ("fidelity", "end_to_end.fp16_nll", -math.inf, "is a number (-inf), expected a finite number >= 0"),
    ("long-output", "summary.positions", -1, "is an integer (-1), expected an integer in [1, 16777216]"),
    ("long-output", "summary.methods.FP16.nll[0]", math.nan, "is a number (nan), expected a finite number >= 0"),
    ("long-output", "summary.methods.Kitty.kl", [0.1], "has 1 values, expected one per span of bin_edges (16)"),
    ("equal-bits", "results[0].budget", 0, "is an integer (0), expected a finite number in (0, 32]"),
    ("equal-bits", "results[0].methods['PN-Mix'].attention_kl", 0.0, "is a number (0.0), expected a finite number > 0"),
    ("role-calibration", "group_size", 0, "is an integer (0), expected an integer in [1, 16777216]"),
    ("role-calibration", "allocations[0].bits[0]", -1, "is an integer (-1), expected an integer in [0, 32]"),
    ("task-accuracy", "tasks[0].chance", 2, "is an integer (2), expected a finite number in [0, 1]"),
    ("task-accuracy", "runs[0].results.a_1k.correct[0]", 2, "is an integer (2), expected one of 0, 1"),
    ("task-accuracy", "runs[0].results.a_1k.correct", [1] * 39, "has 39 outcomes, expected the task's 40 items"),
]


def _at(data: object, path: str) -> tuple[object, object, str]:
    """(container, key, path as the error names it) of the field at `path` in `data`."""
    steps = [
        next(g for g in m.groups() if g is not None) if not m.group(4) else (m.group(4), m.group(5))
        for m in _STEP.finditer(path)
    ]
    shown, keys = "", []
    for step in steps:
        if isinstance(step, tuple):  # the first list item whose extra_info has this value
            step = str(next(i for i, b in enumerate(data) if (b.get("extra_info") or {}).get(step[0]) == step[1]))
        key = int(step) if isinstance(data, list) else step
        keys.append((data, key))
        if isinstance(key, int) or not key.isidentifier():
            shown = f"{shown}[{key!r}]"
        else:
            shown = f"{shown}.{key}" if shown else key
        data = data[key]
    container, key = keys[-1]
    return container, key, shown


def bad_file(folder: Path, result: str, field: str, value: object, says: str) -> tuple[Path, str]:
    """A valid result of `result` with `value` at `field`, written to `folder`; and the line that refuses it."""
    data = json.loads(json.dumps(VALID[result]()))  # the makers share lists between records
    container, key, shown = _at(data, field)
    container[key] = value
    path = folder / f"{result}.json"
    path.write_text(json.dumps(data), encoding="utf-8", errors="surrogatepass")
    return path, f"{path} ({records.kind_of(data)}): {shown}: {says}"


@pytest.mark.parametrize(("result", "field", "value", "says"), BAD_VALUES, ids=lambda x: str(x)[:40])
def test_a_value_out_of_range_is_refused_on_one_line_naming_file_field_value_and_range(
    tmp_path, result, field, value, says
):
    path, line = bad_file(tmp_path, result, field, value, says)
    with pytest.raises(inputs.InputError) as err:
        inputs.load(path, "--input")
    assert err.value.lines == [line]


#: (what the file holds, what its one line says after "cannot read it").
NOT_JSON = [
    (b"[" * 100_000, "as JSON (RecursionError: maximum recursion depth exceeded while decoding a JSON array"),
    (b"1" * 5000, "as JSON (ValueError: Exceeds the limit (4300 digits) for integer string conversion"),
    (b'{"kind": "pnmix-conformance", \xff}', "as JSON (not UTF-8 text: UnicodeDecodeError: 'utf-8' codec"),
    (b"{not json", "as JSON (JSONDecodeError: Expecting property name enclosed in double quotes"),
    (b"", "as JSON (JSONDecodeError: Expecting value: line 1 column 1 (char 0))"),
]


@pytest.mark.parametrize(("content", "says"), NOT_JSON, ids=["deep", "digits", "not-utf8", "malformed", "empty"])
def test_a_file_that_is_not_json_is_refused_on_one_line(tmp_path, content, says):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(inputs.InputError) as err:
        inputs.load(path, "--input")
    (line,) = err.value.lines
    assert line.startswith(f"{path}: cannot read it {says}") and "\n" not in line and len(line) < 400, line


def test_a_value_in_range_at_a_point_that_did_not_run_may_be_null(tmp_path):
    """OOM points and launch choices that do not fit have no figures; the CPU harness leaves out the GPU's."""
    data = synthetic.gpu_benchmarks()
    oom = next(b for b in data["benchmarks"] if b["extra_info"].get("oom"))
    assert oom["extra_info"]["tokens_per_s"] is None or oom["extra_info"]["peak_allocated_gib"] is None
    tiny = synthetic.tiny_benchmarks()
    tiny["benchmarks"][0]["extra_info"]["step_ms"] = None
    for name, d in (("gpu.json", data), ("tiny.json", tiny)):
        inputs.load(synthetic.write(tmp_path, name, d), "--input")


def test_the_outcomes_the_schema_accepts_are_those_the_matrix_shows():
    from conformance import plugin
    from reports.sections import conformance

    assert set(plugin.OUTCOMES) == set(conformance.LABELS)
