"""The TriAxialKV calibration tool on a small random Llama with SmolLM2's tokenizer and template."""

import json

import pytest
import torch

from benchmarks.fidelity import role_calibration


def test_layers_spread_across_depth():
    assert role_calibration.spread_layers(30, 5) == [0, 7, 14, 22, 29]
    assert role_calibration.spread_layers(3, 5) == [0, 1, 2]


def test_only_layers_that_hold_a_methods_cache_are_captured():
    import transformers

    from benchmarks.canaries.workloads import COMMON

    gemma = transformers.Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 6, "sliding_window": 8, "sliding_window_pattern": 3, "layer_types": None}
    )
    assert [i for i, t in enumerate(gemma.layer_types) if t == "full_attention"] == [2, 5]
    assert role_calibration.cache_layers(gemma, 5) == [2, 5]  # the sliding-window layers keep exact caches
    assert role_calibration.cache_layers(gemma, 1) == [2]
    llama = transformers.LlamaConfig(**{**COMMON, "num_hidden_layers": 30})
    assert role_calibration.cache_layers(llama, 5) == [0, 7, 14, 22, 29]


def test_calibration_measures_every_tag_that_occurs_and_allocates_within_each_budget(tiny_chat_model):
    from benchmarks.fidelity import conversations

    model, tokenizer = tiny_chat_model
    rows = conversations.load("calibration").select(range(2))
    cal = role_calibration.calibrate(model, tokenizer, rows, [0, 2])
    d = torch.tensor(cal["distortion"])
    assert d.shape == (len(cal["tags"]), 2) and cal["requests"] == 2
    assert bool(torch.isfinite(d).all()) and bool((d >= 0).all())
    assert bool((d[:, 1] <= d[:, 0]).all())  # INT4 distorts no more than INT2, tag by tag
    assert sum(cal["tokens"]) == sum(len(role_calibration.tag_conversation(tokenizer, r["messages"])[0]) for r in rows)
    assert model.config._attn_implementation == "sdpa"  # put back
    for a in role_calibration.allocations(cal, [3.0, 3.5, 5.0]):
        assert a["average_bits"] <= a["budget"] + 1e-9
    assert role_calibration.allocations(cal, [5.0])[0]["bits"] == [4] * len(cal["tags"])
    result = role_calibration.record(
        "role-calibration",
        command="x",
        model={"name": "tiny", "fingerprint": "f"},
        layers=[0, 2],
        group_size=32,
        calibration=cal,
        allocations=role_calibration.allocations(cal, [3.5]),
    )
    assert json.loads(json.dumps(result))["calibration"] == cal  # plain JSON
    assert "| tag" in role_calibration.render(result)


def test_bad_budgets_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        role_calibration.main(["--budgets", "nan"])
    assert exit_info.value.code == 2 and "--budgets must be positive finite" in capsys.readouterr().err
