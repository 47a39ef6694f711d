"""The memory feasibility model: built from the storage accounting, monotone, and honest about inputs."""

import json

import pytest

from benchmarks.efficiency import memory
from benchmarks.efficiency.architectures import ARCHITECTURES
from reference import storage_model
from reference.methods import METHODS
from reference.paper import FIG6B_MAX_BATCH
from reference.records import GIB

QWEN = ARCHITECTURES["Qwen3-8B"]


def test_fp16_cache_is_every_token_of_every_layer_in_16_bits():
    # 2 (K, V) x 36 layers x 8 KV heads x 128 dims x 2 bytes per token and sequence
    assert memory.cache_bytes(QWEN, "FP16", 32, 141 + 4096) == 32 * (141 + 4096) * 2 * 36 * 8 * 128 * 2


def test_quantized_cache_is_the_storage_model_preallocated_to_capacity():
    cap = 141 + 8192
    per_layer = storage_model(METHODS["PN-Mix"](), 110, 8, 128, cap, capacity=cap)
    assert memory.cache_bytes(QWEN, "PN-Mix", 110, cap) == 36 * per_layer.total
    assert per_layer.residual_key == 110 * 8 * 128 * 128 * 2  # one residual page, allocated whole


def test_peak_is_the_sum_of_its_terms_and_grows_with_batch_and_length():
    p = memory.point(QWEN, "Kitty", 16, 8192)
    assert p.peak == QWEN.weight_bytes() + memory.cache_bytes(QWEN, "Kitty", 16, 141 + 8192) + p.workspace.bytes
    assert p.workspace.source.startswith("estimate:")
    assert memory.point(QWEN, "Kitty", 17, 8192).peak > p.peak
    # the quantized region is allocated in pages of G = 128 tokens: flat within a page, up at the next
    assert memory.point(QWEN, "Kitty", 16, 8193).peak >= p.peak
    assert memory.point(QWEN, "Kitty", 16, 8192 + 128).peak > p.peak


@pytest.mark.parametrize("method", ["FP16", "PN-Mix", "KIVI-1"])
def test_max_batch_is_the_boundary(method):
    best = memory.max_batch(QWEN, method, 8192)
    assert best.fits and not memory.point(QWEN, method, best.batch + 1, 8192).fits


def test_a_budget_below_the_weights_fits_nothing():
    assert memory.max_batch(QWEN, "PN-Mix", 8192, budget_gib=10) is None


def test_paper_comparison_rows_quote_the_paper_and_state_agreement():
    rows = {(r["figure"], r["method"]): r for r in memory.comparison(QWEN)}
    assert all(rows["6b", m]["paper_value"] == b for m, (b, _) in FIG6B_MAX_BATCH.items())
    for r in rows.values():
        assert r["agrees"] == (r["model_value"] == r["paper_value"])
    assert any("B = 111" in note for note in memory.explain(QWEN))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": 0}, "batch must be a positive int"),
        ({"generation": 1.5}, "generation must be a positive int"),
        ({"method": "KIVI-3"}, "method must be one of"),
        ({"budget_gib": -1}, "budget_gib must be positive"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    args = {"method": "PN-Mix", "batch": 1, "generation": 1024, **kwargs}
    with pytest.raises(ValueError, match=message):
        memory.point(QWEN, args.pop("method"), args.pop("batch"), args.pop("generation"), **args)


def test_cli_prints_both_figures_and_the_comparison(capsys):
    assert memory.main(["--budget-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "Fig. 6a" in out and "Fig. 6b" in out and "budget 80.0 GiB" in out and "Against the paper" in out


def test_measured_workspace_is_read_from_a_gpu_run(tmp_path, capsys):
    info = {
        "suite": "fig6-memory",
        "method": "FP16",
        "batch": 20,
        "generation": 8192,
        "device": "GPU X",
        "date_utc": "2026-01-01T00:00:00+00:00",
        "command": "pytest benchmarks",
        "workspace_measured_gib": 0.5,
    }
    oom = {**info, "batch": 21, "workspace_measured_gib": None}
    bench = {"benchmarks": [{"extra_info": info}, {"extra_info": oom}, {"extra_info": {"suite": "kernel"}}]}
    measured = memory.measured_workspaces(bench)
    assert list(measured) == [("FP16", 20, 8192)] and measured["FP16", 20, 8192].bytes == GIB // 2
    assert measured["FP16", 20, 8192].source.startswith("measured: GPU X, 2026-01-01")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert memory.main(["--measured", str(path)]) == 0
    assert "| FP16     |      20 |         8192 |           0.50 |" in capsys.readouterr().out


def _refused(argv: list[str], capsys) -> list[str]:
    """The error lines of a run that must stop with exit 2 before printing anything."""
    with pytest.raises(SystemExit) as exit_:
        memory.main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "", out[:500]
    return [line for line in err.splitlines() if "error" in line]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--budget-gib", "-1"], "--budget-gib: must be a finite number > 0, got '-1'"),
        (["--budget-gib", "0"], "--budget-gib: must be a finite number > 0, got '0'"),
        (["--budget-gib", "nan"], "--budget-gib: must be a finite number > 0, got 'nan'"),
        (["--budget-gib", "inf"], "--budget-gib: must be a finite number > 0, got 'inf'"),
        (["--prompt", "-5"], "--prompt: must be >= 1, got -5"),
        (["--prompt", "0"], "--prompt: must be >= 1, got 0"),
    ],
)
def test_cli_refuses_out_of_range_arguments_on_one_line(capsys, argv, says):
    (line,) = _refused(argv, capsys)
    assert line == f"pnmix-memory: error: argument {says}"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read it (No such file or directory)"),
        ("{not json", "not JSON (Expecting property name"),
        ("[1, 2]", "not a pytest-benchmark result: it has no 'benchmarks' list"),
        (
            json.dumps({"benchmarks": [{"extra_info": {"suite": "fig6-memory", "workspace_measured_gib": 1.0}}]}),
            "benchmarks[0] (fig6-memory): no method, no batch, no generation, no device, no date_utc, no command",
        ),
    ],
)
def test_a_missing_or_malformed_measured_file_stops_before_any_table(tmp_path, capsys, content, says):
    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    (line,) = _refused(["--measured", str(path)], capsys)
    assert line.startswith(f"pnmix-memory: error: --measured {path}: {says}")


def test_every_problem_of_a_measured_file_is_one_line():
    point = {"suite": "fig6-memory", "workspace_measured_gib": 0.5, "method": "X", "batch": True}
    problems = memory.measured_problems({"benchmarks": [{"extra_info": point}, 3, {"extra_info": {"suite": "k"}}]})
    assert problems == [
        "benchmarks[0] (fig6-memory): method='X', batch=True, no generation, no device, no date_utc, no command",
        "benchmarks[1] is not a benchmark with an 'extra_info' object",
    ]
