"""What --input may cost: a file over `reports.inputs.MAX_BYTES` is refused unread, refusals of many files
alike are said once with a count, and a thousand results render in under a minute (each is read, judged and
shown once: nothing compares every result with every other)."""

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from reports import cli, currency, inputs
from reports.markdown import MAX_FIGURES
from reports.tests import synthetic
from reports.tests.test_input_text import current_measurement
from reports.tests.test_report import NOTHING_RUN, no_steps

OUT = ["--name", "r", "--no-committed-results", *NOTHING_RUN]


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch, capsys):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(200 * 2**20)  # 200 MB, sparse: nothing is written
    monkeypatch.setattr(cli.steps, "run_all", no_steps)
    tracemalloc.start()
    try:
        assert cli.main(["--out-dir", str(tmp_path / "out"), *OUT, "--input", str(big)]) == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"pnmix-report: {big}: 209,715,200 bytes, over the 67,108,864 bytes (64 MiB) a result file may have; not read"
    )
    assert peak < 8 * 2**20  # none of it was read


def test_a_file_at_the_limit_is_read(tmp_path):
    data = json.dumps(synthetic.conformance())
    path = tmp_path / "padded.json"
    path.write_text(data[:-1] + " " * (inputs.MAX_BYTES - len(data)) + "}")
    assert path.stat().st_size == inputs.MAX_BYTES and inputs.load(path, "--input").kind == "conformance"


def test_many_files_refused_alike_are_said_once_with_a_count(tmp_path, monkeypatch, capsys):
    for i in range(1000):
        synthetic.write(tmp_path, f"note-{i:04d}.json", {"kind": "notes", "text": i})
    for i in range(2):
        (tmp_path / f"broken-{i}.json").write_text("{" * (i + 1))
    synthetic.write(tmp_path, "odd.json", {"kind": "pnmix-fidelity"})
    monkeypatch.setattr(cli.steps, "run_all", no_steps)
    assert cli.main(["--out-dir", str(tmp_path / "out"), *OUT, "--input", str(tmp_path)]) == 2
    lines = [line.removeprefix("pnmix-report: ") for line in capsys.readouterr().err.splitlines()]
    broken = [line for line in lines if "broken-" in line]
    notes = [line for line in lines if "note-" in line]
    assert len(broken) == 2 and all("cannot read it as JSON" in line for line in broken)
    assert len(notes) == inputs.SHOWN_ALIKE and all("kind 'notes'" in line for line in notes)
    assert f"and {1000 - inputs.SHOWN_ALIKE} more files refused like it" in lines
    assert any(line.startswith(f"{tmp_path / 'odd.json'} (fidelity): ") for line in lines)
    assert len(lines) < 30


def test_past_the_files_said_the_rest_are_counted():
    names = [Path(f"f{i}.json") for i in range(100)]  # 40 problems (digits are particulars: letters), 3 or 2 files
    problem = [a + b for a in "ab" for b in "abcdefghijklmnopqrst"]
    lines = inputs.summarized([(p, [f"{p}: problem {problem[i % 40]}"]) for i, p in enumerate(names)])
    # six problems of three files, two of the seventh's and a count of its third, then the rest counted
    assert len(lines) == inputs.SHOWN_FILES + 2 and lines[-3:] == [
        "f46.json: problem ag",
        "and 1 more file refused like it",
        "and 79 more files refused for other problems",
    ]


def task_accuracy(i: int) -> dict:
    """A current task-accuracy result of its own: FP16's outcome of one item flipped (i mod 40)."""
    data = json.loads(json.dumps(synthetic.task_accuracy()))  # the maker shares lists between runs
    data["runs"][0]["results"]["a_1k"]["correct"][i % 40] ^= 1
    return current_measurement(data)


@pytest.mark.slow
def test_a_thousand_small_results_render_in_under_a_minute(tmp_path, monkeypatch):
    """Every kind of small result (conformance, CPU and GPU timings, task accuracy), 250 of each, each read,
    judged, compared with the others of its kind (the task results contradict each other) and shown."""
    monkeypatch.setattr(currency.canaries, "moved", lambda recorded, pipeline=None: [])
    makers = [
        lambda i: synthetic.conformance(),
        lambda i: synthetic.tiny_benchmarks(),
        lambda i: synthetic.gpu_benchmarks(),
        task_accuracy,
    ]
    (tmp_path / "in").mkdir()
    for i in range(1000):
        synthetic.write(tmp_path / "in", f"r{i:04d}.json", synthetic.current(makers[i % len(makers)](i)))
    start = time.monotonic()
    assert cli.main(["--out-dir", str(tmp_path / "out"), *OUT, "--input", str(tmp_path / "in")]) == 0
    seconds = time.monotonic() - start
    md = (tmp_path / "out" / "r" / "REPORT.md").read_text()
    assert "238 more results have no figure here" in md and "**Contradicting results**" in md.split("## 2.")[0]
    pngs = [p.name for p in (tmp_path / "out" / "r").glob("*.png")]
    for kind in ("task-accuracy-", ("fig6c-", "fig7-", "kernel-")):  # a section's figures, at most MAX_FIGURES
        assert sum(name.startswith(kind) for name in pngs) == MAX_FIGURES, kind
    assert f"{250 * 3 - MAX_FIGURES} more tables have no figure here" in md
    assert seconds < 60, f"{seconds:.0f} s"
