"""A task-accuracy result extended by the runs it lacks (`--extend`): the same as one sweep over every run, the
runs added alone computed, and refused wherever the earlier result was computed otherwise."""

import dataclasses
import json

import pytest

pytest.importorskip("lm_eval")

from benchmarks.accuracy import extension, task_accuracy
from benchmarks.accuracy import sweep as accuracy_sweep
from benchmarks.tests.test_task_accuracy import tiny_task
from reference import methods


def _result(out) -> tuple[object, dict]:
    (path,) = out.glob("task-accuracy-*.json")
    return path, json.loads(path.read_text())


@pytest.mark.slow
def test_an_extended_result_equals_one_sweep_over_all_its_runs(tiny, tmp_path, monkeypatch, capsys):
    from benchmarks.accuracy.lm_eval_model import PNMixLM

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path, distinct=True)
    argv = ["--model", str(tiny), "--include-path", str(tmp_path), "--threads", "1"]
    tasks = ["--tasks", "tinytask_mc", "tinytask_gen"]
    both = ["--runs", "PN-Mix @ 2.25", "Kitty"]
    assert task_accuracy.main([*argv, *tasks, "--out", str(tmp_path / "whole"), *both]) == 0
    _, whole = _result(tmp_path / "whole")
    assert task_accuracy.main([*argv, *tasks, "--out", str(tmp_path / "first"), "--runs", "PN-Mix @ 2.25"]) == 0
    first_path, first = _result(tmp_path / "first")
    score_shared, ran = PNMixLM.score_shared, []

    def counted(self, *args, **kwargs):
        ran.append(self.settings.options.method)
        return score_shared(self, *args, **kwargs)

    monkeypatch.setattr(PNMixLM, "score_shared", counted)
    out = tmp_path / "extended"
    extend = [*argv, "--extend", str(first_path), "--out", str(out)]
    assert task_accuracy.main([*extend, "--runs", "PN-Mix @ 2.25", "Kitty"]) == 0
    assert set(ran) == {"FP16", "Kitty"}  # the earlier PN-Mix run is not run again
    _, merged = _result(out)
    assert merged["runs"] == whole["runs"] and merged["tasks"] == whole["tasks"]
    (earlier,) = merged["extends"]
    assert earlier["file"] == first_path.name and earlier["runs"] == ["FP16", "PN-Mix @ 2.25"]
    assert earlier["command"] == first["command"]
    said = f"runs FP16, PN-Mix @ 2.25 from `{first_path.name}` ({first['date_utc']}, `{first['command']}`)"
    assert said in task_accuracy.markdown(merged)
    # nothing left to add: refused, saying so
    with pytest.raises(SystemExit):
        task_accuracy.main([*extend, "--runs", "PN-Mix @ 2.25"])
    assert "it holds every run asked for; nothing to add" in capsys.readouterr().err


@pytest.mark.slow
def test_an_extension_whose_fp16_answers_otherwise_is_written_alone(tiny, tmp_path, monkeypatch, capsys):
    """FP16 is the check that the new runs pair item by item with the earlier ones: an earlier FP16 outcome that
    this sweep's does not reproduce leaves the earlier result unmerged and says where."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path)
    argv = ["--model", str(tiny), "--include-path", str(tmp_path), "--threads", "1"]
    assert task_accuracy.main([*argv, "--tasks", "tinytask_mc", "--out", str(tmp_path / "a"), "--runs", "Kitty"]) == 0
    path, data = _result(tmp_path / "a")
    correct = data["runs"][0]["results"]["tinytask_mc"]["correct"]
    correct[0] = 1 - correct[0]
    path.write_text(json.dumps(data))
    out = tmp_path / "b"
    assert task_accuracy.main([*argv, "--extend", str(path), "--out", str(out), "--runs", "KIVI @ 1.5"]) == 1
    assert "FP16 answers otherwise than in it on tinytask_mc" in capsys.readouterr().err
    _, alone = _result(out)
    assert [r["label"] for r in alone["runs"]] == ["FP16", "KIVI @ 1.5"] and "extends" not in alone


EARLIER = {
    "model_fingerprint": "abc",
    "task_files": {"pnmix_passkey_1k": "0123"},
    "limit": 50,
    "pair_layout": "split",
    "lm_eval_version": "0.4.13",
    "device": "cpu (x86_64)",
    "runs": [{"label": "FP16", "role": "baseline", "model_args": "method=FP16"}],
    "behaviour": {},
}
SAME = {
    "fingerprint": "abc",
    "files": {"pnmix_passkey_1k": "0123"},
    "limit": 50,
    "layout": "split",
    "lm_eval": "0.4.13",
    "made_in": {"dtype": "float32", "device": "cpu"},
    "pipeline": {},
}


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"fingerprint": "abd"}, "its model file is 'abc'"),
        ({"files": {"pnmix_passkey_1k": "9999"}}, "its task data"),
        ({"limit": 30}, "its documents per task is 50"),
        ({"layout": "adjacent"}, "its pair layout"),
        ({"lm_eval": "0.4.14"}, "its lm-eval version"),
        ({"made_in": {"dtype": "bfloat16", "device": "cuda"}}, "its computation"),
        ({}, "records no canaries"),
    ],
)
def test_an_extension_is_refused_where_the_earlier_result_was_computed_otherwise(given, says):
    with pytest.raises(extension.ExtensionError, match=says):
        extension.check_same(EARLIER, **{**SAME, **given})


def test_a_result_without_its_computation_is_taken_as_its_codes_default_only_where_that_is_certain():
    assert extension.computation(EARLIER) == {"dtype": "float32", "device": "cpu"}
    recorded = {**EARLIER, "dtype": "bfloat16", "device_class": "cuda"}
    assert extension.computation(recorded) == {"dtype": "bfloat16", "device": "cuda"}
    for unknown in (
        {**EARLIER, "device": "NVIDIA H100"},
        {**EARLIER, "runs": [{"label": "x", "role": "baseline", "model_args": "method=FP16,dtype=bfloat16"}]},
    ):
        with pytest.raises(extension.ExtensionError, match="cannot be told"):
            extension.computation(unknown)


def test_a_planned_label_held_with_other_model_args_is_refused():
    plan = accuracy_sweep.plan(64)
    kivi = next(r for r in plan if r.label == "KIVI @ 1.5")
    held = {"runs": [{"label": "KIVI @ 1.5", "model_args": "method=KIVI-2"}]}
    with pytest.raises(extension.ExtensionError, match="ran with model_args 'method=KIVI-2'"):
        extension.missing(held, [kivi])
    assert extension.missing({"runs": [{"label": kivi.label, "model_args": kivi.model_args()}]}, plan) == [
        r for r in plan if r.label != kivi.label
    ]


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_midpoint_control_is_kivis_pick_with_eq7_at_every_budget_with_1_bit_keys(head_dim):
    plan = accuracy_sweep.plan(head_dim)
    kivi = {r.budget: r for r in plan if r.role == "budget" and r.label.startswith("KIVI")}
    controls = {r.budget: r for r in plan if r.role == "control"}
    one_bit = {b for b, r in kivi.items() if 1 in (r.config().b_high, r.config().b_low)}
    assert one_bit and set(controls) == one_bit  # below 2.25 bits KIVI's picks keep 1-bit keys
    for budget, control in controls.items():
        assert control.config() == dataclasses.replace(kivi[budget].config(), one_bit="midpoint")
        assert kivi[budget].config().one_bit == "ends" and control.key_bits == kivi[budget].key_bits
        assert control.label == accuracy_sweep.MIDPOINT_CONTROL.format(budget=budget)


@pytest.mark.parametrize(("head_dim", "role"), [(64, "main"), (256, "budget")])
def test_the_papers_main_configuration_runs_once_in_every_sweep(head_dim, role):
    """H3(50%)L1, G = 128 beside the per-budget picks: a run of its own where no budget picked it (head_dim 64:
    the 2.25-bit pick is H3(40%)L1, G = 64 at the same key bits), else the pick that is it."""
    plan = accuracy_sweep.plan(head_dim)
    (main,) = [r for r in plan if r.describe()["paper_main"]]
    assert main.role == role and main.config() == methods.config("PN-Mix")
    adjacent = [r for r in accuracy_sweep.plan(head_dim, pair_layout="adjacent") if r.describe()["paper_main"]]
    assert len(adjacent) == 1 and adjacent[0].config().pair_layout == "adjacent"
