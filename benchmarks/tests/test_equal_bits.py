"""The equal-bits comparison tool: matching bits, tags to bits, and a whole run on a small random Llama
with SmolLM2's tokenizer and template."""

import json

import pytest

from benchmarks.fidelity import equal_bits
from reference import bit_widths
from reference.tokens.allocation import token_bits
from reference.tokens.config import TokenPrecisionConfig
from reference.tokens.roles import Tag


@pytest.mark.parametrize("method", equal_bits.CHANNEL_METHODS)
@pytest.mark.parametrize("budget", [3.0, 3.25, 3.5, 4.0])
def test_each_channel_method_takes_its_candidate_nearest_the_budget(method, budget):
    config, bits = equal_bits.matched(method, budget, 64, "split")
    w = bit_widths(config, 64)
    assert bits == pytest.approx((w.key_total + w.value_effective) / 2)
    others = [abs(equal_bits.channel_bits(c, 64) - budget) for c in equal_bits.candidates(method, "split")]
    assert abs(bits - budget) == pytest.approx(min(others))
    assert config.residual_length == config.group_size and config.pair_layout == "split"


def test_pnmix_candidates_spend_kivis_key_bits_by_pair():
    for config in equal_bits.candidates("PN-Mix", "split"):
        assert (config.b_high + config.b_low) / 2 in (2, 3, 4) and config.ratio == 0.5
    with pytest.raises(ValueError, match="method must be one of"):
        equal_bits.candidates("FP8", "split")


def test_tags_take_their_allocation_and_unseen_tags_the_high_bits():
    config = TokenPrecisionConfig()
    seen, unseen = Tag(0, 0, 5), Tag(3, 0, 0)
    bits = token_bits([seen, unseen, seen], {str(seen): 2}, config)
    assert bits.tolist() == [2, 4, 2]


def test_a_small_run_measures_every_method_at_each_budget_and_states_the_claims(tiny_chat_model):
    from benchmarks.fidelity import conversations

    model, tokenizer = tiny_chat_model
    out = equal_bits.run(
        model,
        tokenizer,
        conversations.load("calibration").select(range(1)),
        conversations.load("evaluation").select(range(1)),
        budgets=[3.5],
        layers=[0, 2],
        long_tokens=6,
        chunk=256,
        bins=2,
        pair_layout="split",
    )
    (r,) = out["results"]
    assert set(r["methods"]) == set(equal_bits.METHODS)
    for name, m in r["methods"].items():
        assert m["attention_kl"] >= 0 and m["output_mse"] >= 0 and m["e2e_nll"] > 0
        if name != "FP16":
            assert 0 <= m["e2e_top1"] <= 1 and len(r["long_output"][name]["kl"]) == 2
    assert r["methods"]["FP16"]["attention_kl"] == 0 and r["methods"]["FP16"]["output_mse"] == 0
    tri, combo = r["methods"]["TriAxialKV"], r["methods"]["role-aware PN-Mix"]
    assert tri["bits"] <= 3.5 and tri["stored_bits"] == pytest.approx(combo["stored_bits"], abs=0.01)
    assert {m["method"] for m in r["memory"]} == set(equal_bits.METHODS)
    assert all(isinstance(c["holds"], bool) for c in out["claims"])
    result = equal_bits.record("equal-bits", command="x", model="tiny", **out)
    assert json.loads(json.dumps(result, allow_nan=False))["results"][0]["budget"] == 3.5  # plain JSON
    text = equal_bits.markdown(result)
    assert "## Budget 3.5 bits" in text and "role-aware PN-Mix" in text


def test_budgets_below_the_int2_floor_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        equal_bits.main(["--budgets", "2.5"])
    assert exit_info.value.code == 2 and "at least 3.0" in capsys.readouterr().err
