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
    assert all(c["holds"] in (True, False, equal_bits.UNDECIDED) for c in out["claims"])
    # one evaluation conversation: a sign test over it decides nothing, and the row says so
    beats = [c for c in out["claims"] if "beats both" in c["claim"]]
    assert beats and all(c["holds"] == equal_bits.UNDECIDED for c in beats)
    assert all("1 conversations cannot reach p < 0.05" in c["evidence"] for c in beats)
    assert set(r["per_conversation"]) == set(equal_bits.METHODS) - {"FP16"}
    assert all(len(v) == 1 for m in r["per_conversation"].values() for v in m.values())
    result = equal_bits.record("equal-bits", command="x", model="tiny", **out)
    assert json.loads(json.dumps(result, allow_nan=False))["results"][0]["budget"] == 3.5  # plain JSON
    text = equal_bits.markdown(result)
    assert "## Budget 3.5 bits" in text and "role-aware PN-Mix" in text


def test_budgets_below_the_int2_floor_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        equal_bits.main(["--budgets", "2.5"])
    assert exit_info.value.code == 2 and "at least 3.0" in capsys.readouterr().err


def per_conversation(combination: list[float], pnmix: list[float], triaxial: list[float]) -> dict:
    return {
        "role-aware PN-Mix": {"attention_kl": combination, "e2e_kl": combination},
        "PN-Mix": {"attention_kl": pnmix, "e2e_kl": pnmix},
        "TriAxialKV": {"attention_kl": triaxial, "e2e_kl": triaxial},
    }


def test_the_combination_beats_its_rivals_only_conversation_by_conversation():
    """A lower mean is not a verdict: the combination must be below each rival on more conversations than chance
    allows (a sign test per rival); a rival below it beyond chance refutes; anything else is undecided, saying
    what the conversations resolve."""
    low, high = [0.1] * 8, [0.2] * 8
    assert equal_bits.beats(per_conversation(low, high, high), "attention_kl")[0] is True
    assert equal_bits.beats(per_conversation(low, [*low[:7], 0.05], [0.05] * 8), "e2e_kl")[0] is False
    # a far lower mean from one conversation, the others split: undecided
    split = [0.001] + [0.15, 0.25] * 3 + [0.25]
    holds, said = equal_bits.beats(per_conversation(split, [0.2] * 8, [0.2] * 8), "attention_kl")
    assert sum(split) / 8 < 0.2 and holds == equal_bits.UNDECIDED
    assert "below PN-Mix on 4 of 8 conversations" in said and "decide where one side wins on 8 or more" in said
    # lower on 6 of 8 against each rival: more often than not, yet within chance (sign test p 0.29)
    most = [0.1] * 6 + [0.3] * 2
    assert equal_bits.beats(per_conversation(most, high, high), "attention_kl")[0] == equal_bits.UNDECIDED
    assert equal_bits.beats(None, "attention_kl") == (
        equal_bits.UNDECIDED,
        "the result keeps no per-conversation values: the means alone decide nothing",
    )
    # what its conversations could have decided, where the result says how many there were
    assert equal_bits.beats(None, "attention_kl", 4)[1].endswith(
        "; 4 conversations cannot reach p < 0.05 in a sign test whatever they show"
    )
