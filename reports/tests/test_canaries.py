"""Currency by behaviour: a measurement result is current while the canaries it recorded reproduce; a refactor
(a moved file, a moved definition, reworded comments) keeps it current, a change of what a method computes
(Eq. 7's rounding) sends every result that ran the method to History naming it, and a result without
canaries is never current. A canary's floats reproduce under another thread count and move under a small
change of the numerics."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks.canaries import behaviour, outcome, workloads
from reference import records
from reference.equations import quant
from reports import currency
from reports.inputs import Source

#: Canaries of PN-Mix (Eq. 7 at 1 bit), of KIVI-2 (2-bit keys, Eq. 2 only) and of FP16, and the tools' pipelines.
PNMIX, KIVI, FP16 = "PN-Mix", "KIVI-2", "FP16"


@pytest.fixture(autouse=True)
def fresh_canaries():
    """Each test computes its canaries itself (a monkeypatched spec must not read a cached canary)."""
    behaviour._cached.cache_clear()
    yield
    behaviour._cached.cache_clear()


def tools(*names: str) -> dict:
    """The tools' canaries of the pipelines `names`, as the report hands them over (`currency.PIPELINES`)."""
    return {n: currency.PIPELINES[n] for n in names}


def compute(name: str) -> dict:
    """The canary `name` computed now, a pipeline's by its tool's canary."""
    kind, _, rest = name.partition(":")
    return behaviour.compute(name, currency.PIPELINES[rest] if kind == "pipeline" else None)


def result(kind: str, used, *pipeline: str, **extra) -> dict:
    return records.record(kind, "cpu", behaviour=behaviour.record(used, tools(*pipeline)), **extra)


def verdict(data: dict) -> currency.Verdict:
    source = Source(kind=records.kind_of(data), path=Path("r.json"), data=data, origin="committed")
    ((_, v),) = currency.split_source(source)
    return v


def test_a_result_reproduces_its_canaries_where_it_was_written():
    data = result("long-output", [FP16, PNMIX], "long-output")
    assert set(data["behaviour"]["canaries"]) == {
        "method:FP16",
        "hf:llama:FP16",
        "hf:gemma3:FP16",
        "method:PN-Mix",
        "hf:llama:PN-Mix",
        "hf:gemma3:PN-Mix",
        "pipeline:long-output",
    }
    assert data["behaviour"]["versions"]["torch"] == torch.__version__
    behaviour._cached.cache_clear()  # computed again, as a report does
    assert verdict(json.loads(json.dumps(data))) == currency.Verdict(True, "", data["code"]["commit"])


def test_changing_eq7s_rounding_sends_every_result_that_used_it_to_history_naming_it(monkeypatch):
    pnmix, kivi, fp16 = (result("task-accuracy", used) for used in ([FP16, PNMIX], [FP16, KIVI], [FP16]))

    def shifted(xmin, xmax):  # Eq. 7's levels a little off the bin midpoints
        span = xmax - xmin
        return span * 0.5, xmin + span * 0.3

    monkeypatch.setattr(quant, "midpoint_params", shifted)
    behaviour._cached.cache_clear()
    moved = verdict(pnmix)
    assert not moved.current and moved.why.startswith("its canaries moved: ")
    assert "PN-Mix (spec cache): " in moved.why and "PN-Mix through the transformers cache (llama)" in moved.why
    assert "FP16" not in moved.why  # names what moved, nothing else
    assert verdict(kivi).current and verdict(fp16).current  # KIVI-2 and FP16 never quantize at 1 bit by Eq. 7


def test_a_result_without_canaries_is_never_current():
    data = records.record("fidelity", "cpu")  # a code fingerprint of this very process, and no canaries
    assert currency.judge([data["code"]]).current  # what today's rule would have said
    assert verdict(data) == currency.Verdict(False, currency.NO_CANARIES, data["code"]["commit"])
    assert not verdict({**data, "behaviour": {"canaries": {}}}).current
    assert not verdict({**data, "behaviour": None}).current


def test_changed_data_and_a_canary_that_cannot_run_are_named(tmp_path):
    data_file = tmp_path / "documents.jsonl"
    data_file.write_text('{"text": "a"}\n')
    data = records.record(
        "role-calibration", "cpu", behaviour=behaviour.record([KIVI], data=[data_file], model_fingerprint="abc")
    )
    assert verdict(data).current
    data_file.write_text('{"text": "b"}\n')
    assert verdict(data).why == f"its canaries moved: data `{records.code_key(data_file)}` changed"
    gone = {**data["behaviour"], "data": {}, "canaries": {"method:no-such-method": {"exact": {}, "floats": {}}}}
    why = verdict({**data, "behaviour": gone}).why
    assert why.startswith("its canaries moved: no-such-method (spec cache): cannot run (ValueError")


def test_a_canary_that_cannot_run_where_a_result_is_written_keeps_the_result_out_of_the_comparison(monkeypatch):
    def broken(name):
        raise RuntimeError("no device")

    monkeypatch.setattr(behaviour.methods, "run", broken)
    data = records.record("fidelity", "cpu", behaviour=behaviour.record([KIVI]))  # written all the same
    assert data["behaviour"]["canaries"]["method:KIVI-2"] == {"error": "RuntimeError: no device"}
    monkeypatch.undo()
    behaviour._cached.cache_clear()
    v = verdict(data)
    assert not v.current and "KIVI-2 (spec cache): did not run where the result was written" in v.why


def test_floats_agree_within_the_tolerance_and_not_beyond():
    a = [1.0, -2.0, 0.5]
    assert outcome.floats_agree(a, [1.0 + 1e-6, -2.0, 0.5])  # another summation order
    assert not outcome.floats_agree(a, [1.0 + 1e-3, -2.0, 0.5])
    assert outcome.moved({"exact": {"codes": "x"}, "floats": {}}, {"exact": {"codes": "y"}, "floats": {}}) == ["codes"]


CANARIES = ("method:PN-Mix", "method:role-aware PN-Mix", "hf:llama:PN-Mix", "hf:gemma3:KIVI-2", "pipeline:fidelity")


@pytest.mark.parametrize("name", CANARIES)
def test_a_canary_reproduces_under_another_thread_count_and_moves_under_a_small_change(name, monkeypatch):
    once = compute(name)
    monkeypatch.setattr(behaviour, "THREADS", 2)
    assert outcome.moved(once, compute(name)) == []
    # the attention's scaling off by 0.1% (a change of the numerics no rounding of the stored codes sees)
    import reference.channels.cache as channel_cache
    import reference.tokens.cache as token_cache
    from reference.equations import attention

    exact = attention.attention_ref

    def off(q, k, v, *args, scale=None, **kwargs):
        return exact(q, k, v, *args, scale=(scale or q.shape[-1] ** -0.5) * 1.001, **kwargs)

    for module in (attention, channel_cache, token_cache):
        if hasattr(module, "attention_ref"):
            monkeypatch.setattr(module, "attention_ref", off)
    import pnmix.hf

    if hasattr(pnmix.hf, "attention_ref"):
        monkeypatch.setattr(pnmix.hf, "attention_ref", off)
    if name.startswith("pipeline:fidelity"):  # its analyses read the attention through their own functions
        from benchmarks.fidelity import analyses

        monkeypatch.setattr(analyses, "attention_logits_ref", _scaled(analyses.attention_logits_ref))
    assert outcome.moved(once, compute(name)) != []


@pytest.mark.parametrize("name", ["hf:llama:PN-Mix", "hf:gemma3:role-aware PN-Mix", "pipeline:long-output"])
def test_a_canary_reproduces_when_the_arithmetic_moves_by_an_ulp(name, monkeypatch):
    """Another CPU rounds differently in the last place: every weight of the tiny model one ulp up stands for it."""
    once = compute(name)
    seeded = workloads.seeded_weights

    def ulp_up(model, seed=0):
        model = seeded(model, seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.nextafter(p, torch.full_like(p, torch.inf)))
        return model

    monkeypatch.setattr(workloads, "seeded_weights", ulp_up)
    now = compute(name)
    assert now["floats"] != once["floats"]  # the arithmetic did move
    assert outcome.moved(once, now) == []


def _scaled(function):
    def off(q, k, *args, scale=None, **kwargs):
        return function(q, k, *args, scale=(scale or q.shape[-1] ** -0.5) * 1.001, **kwargs)

    return off


#: The packages a copy of the tree needs to run the canaries.
PACKAGES = ("reference", "pnmix", "benchmarks", "conformance")
PROBE = """
import json, sys
from benchmarks.canaries import behaviour
recorded = json.loads(sys.stdin.read())
from benchmarks.fidelity import analyses, equal_bits
pipelines = {**analyses.PIPELINE, **equal_bits.PIPELINE}
print(json.dumps({"moved": behaviour.moved(recorded, pipelines), "root": str(behaviour.ROOT)}))
"""


@pytest.mark.long
def test_a_moved_file_a_moved_definition_and_edited_comments_keep_every_result_current(tmp_path):
    recorded = behaviour.record([PNMIX, KIVI, "role-aware PN-Mix"], tools("fidelity", "equal-bits"))
    for package in PACKAGES:
        shutil.copytree(
            records.ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("tests", "meta", "__pycache__", "results"),
        )
    # a moved file: reference/channels/derived.py is now reference/channels/derived_state.py
    ref = tmp_path / "reference"
    (ref / "channels" / "derived.py").rename(ref / "channels" / "derived_state.py")
    for path in tmp_path.rglob("*.py"):
        text = path.read_text()
        if "reference.channels.derived" in text:
            path.write_text(re.sub(r"reference\.channels\.derived\b", "reference.channels.derived_state", text))
    # a moved definition and reworded comments and docstrings in the file of Eq. 2 and Eq. 7
    quant_py = ref / "equations" / "quant.py"
    text = quant_py.read_text().replace("# + 0.0 turns -0.0 into +0.0", "# adding 0.0 makes -0.0 +0.0")
    text = text.replace('"""Eq. 7 scale and zero in float32', '"""Eq. 7 (reworded): scale and zero, float32', 1)
    start, end = text.index("def midpoint_params("), text.index("\ndef group_params(")
    (ref / "equations" / "midpoint.py").write_text("import torch\n\n\n" + text[start:end])
    quant_py.write_text(text[:start] + "from reference.equations.midpoint import midpoint_params\n" + text[end:])
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps(recorded),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["root"] == str(tmp_path)  # the copy ran, not this checkout
    assert answer["moved"] == []


#: Each measurement kind and the module of the tool that writes it.
TOOLS = {
    "fidelity": "benchmarks/fidelity/analyses.py",
    "long-output": "benchmarks/fidelity/long_output.py",
    "equal-bits": "benchmarks/fidelity/equal_bits.py",
    "role-calibration": "benchmarks/fidelity/role_calibration.py",
    "task-accuracy": "benchmarks/accuracy/task_accuracy.py",
}


@pytest.mark.parametrize("kind", sorted(currency.BEHAVIOUR_KINDS))
def test_every_measurement_tool_records_its_canaries(kind):
    import ast

    tree = ast.parse((records.ROOT / TOOLS[kind]).read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "record"
        and node.args
        and getattr(node.args[0], "value", None) == kind
    ]
    assert calls and all("behaviour" in {k.arg for k in call.keywords} for call in calls)


def test_every_process_of_a_multi_process_launch_runs_the_pipeline_canary(tmp_path, monkeypatch):
    """Under `accelerate launch` / `torchrun` each process records its own canaries (its kept sweep scores carry
    them): the pipeline canary's tiny model is written whatever the process's rank (transformers' save_pretrained
    writes on rank 0 only), and its model joins no process group."""
    import transformers.distributed.mixin as mixin

    from benchmarks.canaries import pipelines

    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert (pipelines.save_tiny(tmp_path) / "config.json").is_file()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    # run now, under this launch (record() may reuse an earlier test's outcome); it raises if it cannot run
    assert compute("pipeline:task-accuracy")["exact"]["generated"]
    assert not list((tmp_path / "tmp").iterdir())  # its copy of the tiny model is removed, not left to the disk
    assert os.environ["WORLD_SIZE"] == "2"  # the launch's environment is back
