"""Long-output fidelity: teacher forcing over chunks measures what token-by-token decoding gives,
and the tool's results say what they measured."""

import json
import weakref

import pytest
import torch

from benchmarks.accuracy import stats
from benchmarks.fidelity import long_output
from reference.methods import METHODS


def tiny_llama():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_the_chunk_size_does_not_change_what_is_measured():
    import pnmix.hf  # noqa: F401  (registers "pnmix")

    model = tiny_llama()
    ids = torch.randint(3, 128, (1, 70), generator=torch.Generator().manual_seed(5))
    configs = {n: METHODS[n](group_size=8, residual_length=8, n_sink=2) for n in ("KIVI-2", "PN-Mix")}
    one = long_output.measure_sequence(model, ids, 10, configs, chunk=1)
    chunked = long_output.measure_sequence(model, ids, 10, configs, chunk=13)
    for name, metrics in one.items():
        for metric, values in metrics.items():
            assert len(values) == 60, (name, metric)
            torch.testing.assert_close(torch.tensor(chunked[name][metric]), torch.tensor(values), rtol=1e-5, atol=1e-6)
    assert max(one["PN-Mix"]["kl"]) > 0 and all(v >= 0 for v in one["PN-Mix"]["kl"])


def test_each_methods_outputs_are_freed_before_the_next_method_runs(monkeypatch):
    """At most one distribution over the vocabulary is held when the next is computed: the chunk's FP16
    reference (a 262K vocabulary makes each of them the largest thing held)."""
    import pnmix.hf  # noqa: F401  (registers "pnmix")

    held, seen, log_probs = [], [], long_output._log_probs

    def tracked(*args):
        held.append(sum(ref() is not None for ref in seen))
        out = log_probs(*args)
        seen.append(weakref.ref(out))
        return out

    monkeypatch.setattr(long_output, "_log_probs", tracked)
    configs = {n: METHODS[n](group_size=8, residual_length=8, n_sink=2) for n in ("KIVI-2", "Kitty", "PN-Mix")}
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(5))
    long_output.measure_sequence(tiny_llama(), ids, 10, configs, chunk=13)
    assert len(held) == 4 * 4 and max(held) == 1  # (prompt + 3 chunks) x (FP16 + 3 methods)


class ByteTokenizer:
    """Just what `greedy_outputs` asks of a tokenizer: a chat template and left padding."""

    padding_side, pad_token_id, eos_token_id = "right", 0, 1

    def apply_chat_template(self, chat, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{turn['role']}>{turn['content']}" for turn in chat) + "<assistant>"

    def __call__(self, texts, return_tensors, padding, add_special_tokens):
        ids = [[3 + ord(c) % 120 for c in text] for text in texts]
        width = max(map(len, ids))
        rows = [[0] * (width - len(r)) + r if self.padding_side == "left" else r + [0] * (width - len(r)) for r in ids]
        mask = [[int(i >= width - len(r)) for i in range(width)] for r in ids]
        return {"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(mask)}


def test_batched_greedy_outputs_are_each_prompts_own_greedy_output():
    model, tokenizer = tiny_llama(), ByteTokenizer()
    prompts = ["a long question about trains", "short", "a middle one"]
    sequences = long_output.greedy_outputs(model, tokenizer, prompts, 9, context=64)
    assert tokenizer.padding_side == "right"  # restored
    for prompt, (ids, prompt_len) in zip(prompts, sequences, strict=True):
        alone = tokenizer(
            [tokenizer.apply_chat_template([{"role": "user", "content": prompt}], True, False)], "pt", False, False
        )["input_ids"]
        assert prompt_len == alone.shape[1] and ids.shape == (1, prompt_len + 9)
        expected = model.generate(input_ids=alone, max_new_tokens=9, min_new_tokens=9, do_sample=False, pad_token_id=0)
        assert torch.equal(ids, expected)
    with pytest.raises(ValueError, match="--tokens"):
        long_output.greedy_outputs(model, tokenizer, prompts, 9, context=len(prompts[0]) + 12)


def test_sampled_outputs_are_the_seeds_and_leave_the_callers_random_state_alone():
    """--temperature: FP16's outputs sampled, the same for the same seed, another for another seed (or greedy),
    and the process's random stream as it was (the methods' own draws do not depend on it)."""
    model, tokenizer = tiny_llama(), ByteTokenizer()
    prompts = ["a long question about trains", "short"]

    def outputs(**kwargs):
        return [ids for ids, _ in long_output.greedy_outputs(model, tokenizer, prompts, 24, 128, **kwargs)]

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = outputs(temperature=1.0, seed=1)
    assert torch.equal(torch.rand(1), before)  # the stream is the caller's again
    assert all(map(torch.equal, first, outputs(temperature=1.0, seed=1)))
    assert not all(map(torch.equal, first, outputs(temperature=1.0, seed=2)))
    assert not all(map(torch.equal, first, outputs()))


def test_bins_are_means_of_equal_spans():
    assert long_output.binned([1, 1, 3, 3, 5, 5], 3) == [1, 3, 5]
    assert long_output.binned(list(range(10)), 2) == [2, 7]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "0"], "must be >= 1"),
        (["--methods", "FP16"], "--methods: unknown"),
        (["--model", "/nope"], "--model"),
    ],
)
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        long_output.main([*args, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.model
@pytest.mark.long
def test_the_smoke_run_writes_what_it_measured(tmp_path):
    assert long_output.main(["--smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("long-output-*.json")
    result = json.loads(path.read_text())
    assert result["kind"] == "pnmix-long-output" and result["model_fingerprint"].startswith("sha256:")
    assert result["summary"]["positions"] == 64 and set(result["summary"]["methods"]) == {
        *long_output.DEFAULT_METHODS,
        "FP16",
    }
    assert (tmp_path / path.name.replace(".json", ".png")).stat().st_size > 0
    assert len(result["loop_onsets"]) == 1  # the smoke run's one prompt, looping or not, is recorded


def test_an_output_loops_from_the_first_position_that_repeats_a_run_of_it():
    text = list(range(100))
    assert long_output.loop_onset(text) is None  # no token twice
    looped = text[:40] + text[10:40] * 3  # from position 40 it copies positions 10.. again
    assert long_output.loop_onset(looped) == 40
    assert long_output.loop_onset(looped, span=31) == 40 and long_output.loop_onset(text[:40] + text[:20]) is None
    almost = text[:40] + text[9:40]  # 31 tokens repeated: below the span
    assert long_output.loop_onset(almost, span=32) is None and long_output.loop_onset(almost, span=31) == 40


def result_of(per_prompt: list[dict], bins: int) -> dict:
    """A long-output result as the tool records it, from each prompt's per-method series."""
    return long_output.record(
        "long-output",
        "cpu",
        command="x",
        model="M (x)",
        prompts=len(per_prompt),
        chunk=1,
        summary=long_output.summarize(per_prompt, bins),
        per_prompt=per_prompt,
    )


def test_the_verdicts_say_where_fp16s_own_text_loops():
    flat = {"kl": [0.1] * 8, "top1": [1.0] * 8, "nll": [0.1] * 8}
    result = result_of([{"FP16": {"nll": [0.1] * 8}, "PN-Mix": flat}], 8)
    assert "loops" not in long_output.verdicts(result)["accumulates"][1]
    result["loop_onsets"] = [5]
    said = long_output.verdicts(result)["accumulates"][1]
    assert "loops (repeats a run of 32 tokens) from position 5 on 1 of 1 prompts" in said
    result["loop_onsets"] = [None]
    assert "repeats no run of 32 tokens within the 8 positions" in long_output.verdicts(result)["accumulates"][1]
    assert "repeats no run of 32 tokens" in long_output.markdown(result)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot be read"),
        ("", "holds no prompt"),
        ('{"prompt": "a"}\n{"prompt": \n', "line 2: not JSON"),
        ('{"id": 1}\n', 'line 1: expected an object with a "prompt"'),
        ('{"prompt": [{"role": "user"}]}\n', "line 1: expected"),
    ],
)
def test_a_prompt_set_that_is_no_list_of_prompts_is_refused_naming_its_line(tmp_path, capsys, text, message):
    path = tmp_path / "prompts.jsonl"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        long_output.main(["--prompt-set", str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and f"--prompt-set: {path}" in (err := capsys.readouterr().err) and message in err
    assert not (tmp_path / "out").exists()


def test_the_default_prompts_ask_for_long_texts_enough_for_a_sign_test_to_decide():
    prompts = long_output.read_prompts(long_output.PROMPT_SET)
    assert len(prompts) >= 16 and len(set(prompts)) == len(prompts)
    need, share = stats.resolvable_share(len(prompts))
    assert need < len(prompts) and share < 0.9  # a verdict does not need every prompt to agree
    assert stats.resolvable_share(long_output.MIN_PROMPTS)[0] == long_output.MIN_PROMPTS
    assert stats.resolvable_share(3) is None


def test_quarters_start_where_a_prompts_caches_first_read_a_quantized_page():
    """Before the first flush every cache is exact (KL 0): a rise from the first quarter to the last would only
    say that the flush came. With 2 sinks and pages of 8, a 3-token prompt's cache first holds a quantized page
    when it holds 10 tokens, at output position 6 (a 5-token prompt's at 4); results that do not record their
    prompts' lengths keep every position."""
    pages = {"group_size": 8, "residual_length": 8, "n_sink": 2}
    assert long_output.first_quantized(3, pages) == 6 and long_output.first_quantized(5, pages) == 4
    assert long_output.first_quantized(50, {"group_size": 128, "residual_length": 128, "n_sink": 32}) == 109
    kl = [0.0] * 6 + [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    series = {"FP16": {"nll": [0.1] * len(kl)}, "PN-Mix": {"kl": kl, "top1": [1.0] * len(kl), "nll": [0.1] * len(kl)}}
    result = result_of([series], len(kl))
    assert long_output.per_prompt_quarters(result, "PN-Mix") == [long_output.quarter_means(kl)]
    result |= {"pages": pages, "prompt_lengths": [3]}
    assert long_output.per_prompt_quarters(result, "PN-Mix") == [[1.0, 2.0, 3.0, 4.0]]
    assert (
        "from its first position that reads a quantized page (positions 6-6"
        in long_output.verdicts(result)["accumulates"][1]
    )
