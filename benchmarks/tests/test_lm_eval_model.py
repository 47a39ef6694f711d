"""The lm-eval model "pnmix": its numbers are the model's own through FP16, decode steps after the mark
attend as token-by-token decoding does, continuations of one context share it correctly, and bad
model_args are refused in one line before anything loads."""

import dataclasses
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance

from benchmarks.accuracy import lm_eval_cli, lm_eval_model
from benchmarks.accuracy.lm_eval_model import DECODE_MARK, PNMixLM
from benchmarks.accuracy.model_args import (
    LM_EVAL_PASSES,
    PLAIN_TEXT,
    ModelArgsError,
    Options,
    check,
    check_chat,
    context_tags,
)
from benchmarks.tests.conftest import CORPUS
from reference.tokens.roles import SYSTEM, TEMPLATE, USER

ROOT = Path(__file__).resolve().parents[2]
#: Small pages, so that a few dozen tokens reach the quantized region.
PAGES = {"group_size": 8, "residual_length": 8, "n_sink": 2}
DOCUMENT = "A document about trains, boats and planes. The quick brown fox jumps over the lazy dog."
QUESTION = " Question: what is the passkey? Answer:"
CONTINUATIONS = (" 4213.", " boats and planes", " 0")


@pytest.fixture(scope="module")
def fp16(tiny) -> PNMixLM:
    return PNMixLM(pretrained=str(tiny), method="FP16", chunk=3)


@pytest.fixture(scope="module")
def pnmix(tiny) -> PNMixLM:
    return PNMixLM(pretrained=str(tiny), method="PN-Mix", chunk=5, **PAGES)


@pytest.fixture(scope="module")
def plain(tiny):
    """The same model and tokenizer loaded by transformers alone, with its own attention."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, attn_implementation="sdpa").eval()
    return model, transformers.AutoTokenizer.from_pretrained(tiny)


def requests(kind: str, *args) -> list[Instance]:
    return [Instance(kind, {}, a, i, metadata=("tiny", i, 1)) for i, a in enumerate(args)]


def full_forward(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) from one forward of the whole sequence, exact attention, split as
    HFLM splits it (context encoded alone, the rest of context + continuation after it)."""
    text = context.replace(DECODE_MARK, "")
    if text:
        ids, n = tokenizer.encode(text + continuation), len(tokenizer.encode(text))
    else:  # the prefix token as the context
        ids, n = [tokenizer.bos_token_id, *tokenizer.encode(continuation, add_special_tokens=False)], 1
    return scored(model, ids, n)


def scored(model, ids: list[int], n: int) -> tuple[float, bool]:
    """(sum of log p(ids[i] | ids[:i]) for i >= n, whether each is the argmax), one exact forward."""
    with torch.no_grad():
        log_p = torch.log_softmax(model(input_ids=torch.tensor([ids[:-1]])).logits[0].double(), -1)[n - 1 :]
    target = torch.tensor(ids[n:])
    return float(log_p.gather(-1, target[:, None]).sum()), bool((log_p.argmax(-1) == target).all())


CASES = [
    (DOCUMENT + QUESTION, " 4213."),  # no mark: the whole context is the prompt
    (DOCUMENT + DECODE_MARK + QUESTION, " 4213."),  # the question enters as decode steps
    (DOCUMENT + QUESTION + DECODE_MARK, " boats and planes"),  # a trailing mark: only the continuation decoded
    ("", "The quick brown fox"),  # an empty context: the prefix token
]


def test_fp16_through_the_cache_is_the_models_own_loglikelihood(fp16, plain):
    # float32, tight: the cache path sums the same products in another order (one SDPA over the whole
    # sequence here; prefill SDPA, then chunks of 3 through the reference's stepwise attention there),
    # about 1e-6 relative per logit, summed over a few tokens.
    got = fp16.loglikelihood(requests("loglikelihood", *CASES))
    for (context, continuation), (log_p, greedy) in zip(CASES, got, strict=True):
        want, want_greedy = full_forward(*plain, context, continuation)
        assert math.isclose(log_p, want, rel_tol=1e-5, abs_tol=1e-4), (context, log_p, want)
        assert greedy == want_greedy


def test_fp16_greedy_generation_is_model_generate_and_stops_where_asked(fp16, plain):
    model, tokenizer = plain
    ids = tokenizer.encode(DOCUMENT + QUESTION)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    want = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    context = DOCUMENT + DECODE_MARK + QUESTION
    (got,) = fp16.generate_until(requests("generate_until", (context, {"until": [], "max_gen_toks": 12})))
    assert got == want and len(want) > 3
    stop = want[2:4]  # a stop string inside the output: the text ends before its first occurrence
    (cut,) = fp16.generate_until(requests("generate_until", (context, {"until": [stop], "max_gen_toks": 12})))
    assert cut == want[: want.index(stop)]


def manual_decode(lm: PNMixLM, context: str, continuation: str) -> float:
    """log p(continuation | context) decoding one token per forward through a PNMixHFCache of the lm's
    configuration: the prompt (text before the mark, as its own tokens) prefilled, the rest appended."""
    from pnmix.hf import PNMixHFCache, cache_argument

    tok = lm.tokenizer
    before, _ = context.split(DECODE_MARK)
    ids = tok.encode(context.replace(DECODE_MARK, "") + continuation)
    prompt, n = len(tok.encode(before)), len(tok.encode(context.replace(DECODE_MARK, "")))
    assert ids[:prompt] == tok.encode(before)
    cache = PNMixHFCache(lm.model.config, lm.config, backend="reference")
    logits = []
    with torch.no_grad():
        for a, b in [(0, prompt), *((i, i + 1) for i in range(prompt, len(ids) - 1))]:
            out = lm.model(input_ids=torch.tensor([ids[a:b]]), **{cache_argument(lm.model): cache})
            logits.append(out.logits[0, -1])  # the logits at positions prompt - 1, prompt, ...
    log_p = torch.log_softmax(torch.stack(logits).double(), -1)[n - prompt :]
    return float(log_p.gather(-1, torch.tensor(ids[n:])[:, None]).sum())


@pytest.mark.parametrize("method", ["PN-Mix", "KIVI-2"])
def test_a_quantized_method_decodes_after_the_mark_as_token_by_token_decoding(tiny, fp16, pnmix, method):
    lm = pnmix if method == "PN-Mix" else PNMixLM(pretrained=str(tiny), method=method, chunk=4, **PAGES)
    context = DOCUMENT + DECODE_MARK + QUESTION  # about 20 prompt tokens, 10 decoded, then the continuation
    pairs = [(context, c) for c in CONTINUATIONS]
    got = [lp for lp, _ in lm.loglikelihood(requests("loglikelihood", *pairs))]
    exact = [lp for lp, _ in fp16.loglikelihood(requests("loglikelihood", *pairs))]
    assert all(math.isfinite(x) for x in got)
    assert min(abs(a - b) for a, b in zip(got, exact, strict=True)) > 1e-4  # the quantized cache is read
    for (ctx, cont), log_p in zip(pairs, got, strict=True):
        assert math.isclose(log_p, manual_decode(lm, ctx, cont), rel_tol=1e-5, abs_tol=1e-4)


def test_continuations_of_one_context_score_as_each_alone(pnmix):
    pairs = [(DOCUMENT + DECODE_MARK + QUESTION, c) for c in CONTINUATIONS]
    together = pnmix.loglikelihood(requests("loglikelihood", *pairs))
    alone = [pnmix.loglikelihood(requests("loglikelihood", p))[0] for p in reversed(pairs)][::-1]
    assert together == alone


def test_an_implementation_runs_through_the_protocol(tiny, pnmix):
    lm = PNMixLM(pretrained=str(tiny), impl="reports.tests.thirdparty:make", **PAGES)
    assert lm.config.b_high == lm.config.b_low  # KIVI-style: its preset maps PN-Mix's configuration
    pairs = [(DOCUMENT + DECODE_MARK + QUESTION, c) for c in CONTINUATIONS[:2]]
    together = lm.loglikelihood(requests("loglikelihood", *pairs))
    assert together == [lm.loglikelihood(requests("loglikelihood", p))[0] for p in pairs]  # recomputed, not rolled
    assert all(math.isfinite(lp) for lp, _ in together)
    assert lm.get_model_info()["pnmix"]["impl"]["name"] == "reports.tests.thirdparty:make"


def test_rolling_loglikelihood_sums_lm_evals_windows(tiny, fp16, plain):
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    model, tokenizer = plain
    text = " ".join(CORPUS)
    ids = tokenizer.encode(text)  # BOS included, as HFLM's tok_encode gives it
    bos = tokenizer.bos_token_id
    (whole,) = fp16.loglikelihood_rolling(requests("loglikelihood_rolling", (text,)))
    assert math.isclose(whole, scored(model, [bos, *ids], 1)[0], rel_tol=1e-5, abs_tol=1e-4)  # one window
    short = PNMixLM(pretrained=str(tiny), method="FP16", max_length=16)
    (windowed,) = short.loglikelihood_rolling(requests("loglikelihood_rolling", (text,)))
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(ids, bos, 16, 1)]
    assert len(windows) > 2
    want = sum(scored(model, ctx + cont, len(ctx))[0] for ctx, cont in windows)
    assert math.isclose(windowed, want, rel_tol=1e-5, abs_tol=1e-4)


def allocation(path: Path) -> Path:
    data = {
        "kind": "role-calibration",
        "group_size": 32,
        "model": {"name": "tiny"},
        "calibration": {"tags": [str(PLAIN_TEXT), "current / text / answer"]},
        "allocations": [{"budget": 3.5, "bits": [2, 4]}, {"budget": 4.0, "bits": [4, 4]}],
    }
    path.write_text(json.dumps(data))
    return path


def test_a_per_token_method_takes_its_bits_from_the_allocation(tiny, tmp_path, fp16):
    lm = PNMixLM(pretrained=str(tiny), method="TriAxialKV", allocation=str(allocation(tmp_path / "a.json")), budget=3.5)
    text = DOCUMENT + QUESTION
    cache = lm._new_cache(text, lm.tok_encode(text))
    schedule = cache.layers[0].schedule
    n = len(lm.tok_encode(text))
    assert schedule(0, n + 3).tolist() == [2] * n + [4] * 3  # the prompt one user turn, generated text the answer
    pairs = [(DOCUMENT + DECODE_MARK + QUESTION, c) for c in CONTINUATIONS]
    got = lm.loglikelihood(requests("loglikelihood", *pairs))
    assert all(math.isfinite(lp) for lp, _ in got)
    assert got == [lm.loglikelihood(requests("loglikelihood", p))[0] for p in pairs]


def test_chat_text_is_tagged_as_a_chat_and_plain_text_as_one_user_turn(fp16):
    tok = fp16.tokenizer
    chat = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nThe passkey?<|im_end|>\n"
    tags = context_tags(tok, chat, len(tok.encode(chat)), {})
    assert {t.role for t in tags} == {SYSTEM, USER, TEMPLATE}
    assert context_tags(tok, DOCUMENT, 7, {}) == [PLAIN_TEXT] * 7


def test_overrides_apply_on_top_of_the_method_and_an_implementations_preset(tiny):
    settings = check({"pretrained": str(tiny), "b_high": 4, "ratio": 0.3, "group_size": 64, "scale_dtype": "float32"})
    c = settings.config
    assert (c.b_high, c.b_low, c.ratio, c.group_size, c.residual_length) == (4, 1, 0.3, 64, 128)
    assert c.scale_dtype == torch.float32 and c.n_sink == 32  # the rest is PN-Mix's
    kivi = check({"pretrained": str(tiny), "method": "KIVI-2", "group_size": 32, "residual_length": 32}).config
    assert (kivi.b_high, kivi.b_low, kivi.group_size, kivi.value_residual) == (2, 2, 32, "sliding")
    mapped = check({"pretrained": str(tiny), "impl": "kivi", "b_low": 2, "value_bits": 4}).config
    assert (mapped.b_high, mapped.b_low, mapped.value_bits, mapped.value_residual) == (2, 2, 4, "sliding")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ({"method": "Nope"}, "method='Nope'"),
        ({"impl": "no_such_package.module:make"}, "impl=no_such_package.module:make"),
        ({"b_high": "four"}, "b_high='four': expected an int"),
        ({"ratio": True}, "ratio=True: expected a number"),
        ({"group_size": 64.0}, "group_size=64.0: expected an int"),
        ({"frobnicate": 1}, "frobnicate=1: neither an option"),
        ({"group_size": 12}, "group_size=12"),  # the configuration's own check, naming the override
        ({"batch_size": "auto:2"}, "batch_size='auto:2'"),
        ({"budget": 3.5}, "budget/allocation with method=PN-Mix"),
        ({"method": "TriAxialKV", "allocation": "ALLOC"}, "budget=None: a.json allocates bits at budgets [3.5, 4.0]"),
        ({"method": "TriAxialKV", "allocation": "ALLOC", "budget": 3.5, "group_size": 64}, "group_size=64"),
        ({"impl": "reports.tests.thirdparty:make", "method": "TriAxialKV"}, "impl=reports.tests.thirdparty:make"),
        ({"pretrained": "/no/such/model"}, "pretrained=/no/such/model"),
        ({"chat_template": "/no/such.jinja"}, "chat_template=/no/such.jinja"),
        ({"dtype": "float8"}, "dtype='float8'"),
        ({"device": "meta"}, "device='meta': no data lives on the meta device"),
    ],
)
def test_bad_model_args_are_refused_in_one_line_before_loading(tiny, tmp_path, args, names):
    args = {"pretrained": str(tiny), **args}
    if args.get("allocation") == "ALLOC":
        args["allocation"] = str(allocation(tmp_path / "a.json"))
    with pytest.raises(ModelArgsError) as error:
        PNMixLM(**args)
    assert names in str(error.value) and "\n" not in str(error.value)


def test_a_chat_template_request_needs_a_template(tiny, tmp_path):
    with pytest.raises(ModelArgsError, match="ships no chat template"):
        check_chat(check({"pretrained": str(tiny)}))
    with pytest.raises(ModelArgsError, match="chat_template=none"):
        check_chat(check({"pretrained": str(tiny), "chat_template": "none"}))
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    check_chat(check({"pretrained": str(tiny), "chat_template": str(template)}))


def test_a_request_past_max_length_is_refused_naming_the_document(tiny):
    lm = PNMixLM(pretrained=str(tiny), method="FP16", max_length=16)
    with pytest.raises(ValueError, match=r"task tiny doc 0: context \+ continuation is \d+ tokens, past max_length=16"):
        lm.loglikelihood(requests("loglikelihood", (DOCUMENT + QUESTION, " 4213.")))
    with pytest.raises(ValueError, match="max_gen_toks=12"):
        lm.generate_until(requests("generate_until", (DOCUMENT, {"until": [], "max_gen_toks": 12})))


def test_the_command_refuses_an_output_path_it_cannot_write_before_running(tiny, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    configs = str(ROOT / "benchmarks" / "tasks" / "configs")
    argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny}", "--tasks", "pnmix_passkey_1k"]
    argv += ["--include_path", configs]
    assert lm_eval_cli.main([*argv, "--output_path", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"pnmix-lm-eval: error: --output_path {blocker / 'out'}: ") and "not a folder" in err[-1]


def test_the_command_refuses_an_unknown_task_before_the_model_loads(tiny, capsys, monkeypatch):
    monkeypatch.setattr(lm_eval_model.PNMixLM, "__init__", lambda *a, **k: pytest.fail("refused before loading"))
    configs = str(ROOT / "benchmarks" / "tasks" / "configs")
    argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny}", "--include_path", configs]
    assert lm_eval_cli.main([*argv, "--tasks", "pnmix_pasky_1k"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pnmix-lm-eval: error: --tasks: unknown task(s) ['pnmix_pasky_1k']")
    assert "did you mean pnmix_passkey_1k" in err


def test_the_command_refuses_bad_model_args_in_one_line(tiny, capsys):
    argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny},b_high=x", "--tasks", "anything"]
    assert lm_eval_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "pnmix-lm-eval: error: model_args b_high='x': expected an int"


def _tiny_task(tmp_path, name: str = "pnmix_tiny_cached") -> None:
    data = tmp_path / "tiny.jsonl"
    docs = [
        {"context": DOCUMENT + DECODE_MARK + QUESTION, "choices": [" 4213", " boats"], "answer": 0},
        {"context": "Numbers 0123456789. Answer:", "choices": [" 0", " 9"], "answer": 1},
    ]
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tiny.yaml").write_text(
        f"task: {name}\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )


@pytest.mark.slow  # a fresh process importing lm-eval and torch: about 15 s on two CPU cores
def test_the_command_runs_a_task_and_records_the_method(tiny, tmp_path):
    _tiny_task(tmp_path, "pnmix_tiny_mc")
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "benchmarks.accuracy.lm_eval_cli",
        "--model",
        "pnmix",
        "--model_args",
        f"pretrained={tiny},method=FP16",
        "--tasks",
        "pnmix_tiny_mc",
        "--include_path",
        str(tmp_path),
        "--limit",
        "2",
        "--output_path",
        str(out),
    ]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (path,) = out.rglob("results_*.json")
    result = json.loads(path.read_text())
    assert result["results"]["pnmix_tiny_mc"]["acc,none"] in (0.0, 0.5, 1.0)
    assert result["results"]["pnmix_tiny_mc"]["sample_len"] == 2
    assert result["config"]["pnmix"]["method"] == "FP16" and result["config"]["pnmix"]["decode_mark"] == DECODE_MARK
    # lm-eval's results table keeps its column names (pytablewriter before 1.0 printed them as A, B, C, ...)
    header = next(line for line in run.stdout.splitlines() if line.startswith("|") and "pnmix_tiny_mc" not in line)
    assert [cell.strip() for cell in header.strip("|").split("|")][:6] == [
        "Tasks",
        "Version",
        "Filter",
        "n-shot",
        "Metric",
        "",
    ]


SHARED_RUNS = [
    {"method": "PN-Mix", **PAGES},
    {"method": "KIVI-2", **PAGES},
    {"method": "FP16"},
    {"impl": "reports.tests.thirdparty:make", **PAGES},
]


@pytest.mark.parametrize("model_args", SHARED_RUNS)
def test_a_shared_prompt_forward_scores_as_each_methods_own(tiny, fp16, model_args):
    """A sweep runs the prompt once (exact prefill attention is the same for every cache) and starts each
    method's cache from it: the scores are those of the method's own pass."""
    own = PNMixLM(pretrained=str(tiny), chunk=4, **model_args)
    shared = PNMixLM(share=fp16, **model_args)
    assert shared.model is fp16.model and shared.config == own.config
    context = DOCUMENT + DECODE_MARK + QUESTION
    pairs = [(context, c) for c in CONTINUATIONS]
    expected = own.loglikelihood(requests("loglikelihood", *pairs))
    context_enc = own.tok_encode(context.replace(DECODE_MARK, ""))
    prompt = own.prompt_length(context, context_enc)
    conts = [own.encode_pair(context, c)[1] for c in CONTINUATIONS]
    recorded = fp16.record_prompt(context_enc[:prompt])
    got = shared.score_shared(context.replace(DECODE_MARK, "").rstrip(), context_enc, prompt, conts, recorded)
    for (lp, greedy), (lp_own, greedy_own) in zip(got, expected, strict=True):
        assert math.isclose(lp, lp_own, rel_tol=1e-5, abs_tol=1e-4) and greedy == greedy_own


@pytest.mark.parametrize("model_args", SHARED_RUNS)
def test_a_shared_prompt_forward_generates_as_each_methods_own(tiny, fp16, model_args):
    """The sweep's generation: each method decodes greedily through its own cache started from the one
    prompt forward; the text is that of the method's own generate_until, stop strings and all."""
    from benchmarks.accuracy.task_accuracy import Shared, _request_key

    own = PNMixLM(pretrained=str(tiny), chunk=fp16.settings.options.chunk, **model_args)
    shared = Shared(fp16, {"run": PNMixLM(share=fp16, **model_args)})
    asked = requests(
        "generate_until",
        (DOCUMENT + DECODE_MARK + QUESTION, {"until": ["\n"], "max_gen_toks": 10}),
        (DOCUMENT + QUESTION, {"until": [], "max_gen_toks": 6}),  # no mark: the cache is read from the 2nd token
    )
    shared.generate(asked)
    got = [shared.generations["run"][_request_key(r.args)] for r in asked]
    assert got == own.generate_until(asked) and all(got)


def test_a_request_whose_score_cannot_depend_on_the_cache_is_warned_of_once_per_task(pnmix, caplog):
    one_token = [w for w in (" the", " fox", " dog", ".", " a") if len(pnmix.encode_pair(DOCUMENT, w)[1]) == 1]
    blind = (DOCUMENT + QUESTION, one_token[0])  # no mark and one continuation token
    marked = (DOCUMENT + DECODE_MARK + QUESTION, one_token[0])  # the question reads the cache
    with caplog.at_level(logging.WARNING, logger=lm_eval_model.__name__):
        pnmix.loglikelihood(requests("loglikelihood", marked))
        assert "cannot depend on the cache" not in caplog.text
        pnmix.loglikelihood(requests("loglikelihood", blind, blind))
    assert caplog.text.count("cannot depend on the cache") == 1 and "task tiny" in caplog.text


@pytest.mark.slow  # three lm-eval runs in this process: about 20 s on two CPU cores
def test_a_cached_rerun_gives_the_same_numbers_and_another_method_never_reads_its_cache(
    tiny, tmp_path, monkeypatch, capsys
):
    _tiny_task(tmp_path)
    cache = tmp_path / "requests"

    def run(method: str, out: str) -> dict:
        argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny},method={method}", "--tasks"]
        argv += ["pnmix_tiny_cached", "--include_path", str(tmp_path), "--output_path", str(tmp_path / out)]
        assert lm_eval_cli.main([*argv, "--use_cache", str(cache), "--log_samples"]) == 0
        (path,) = (tmp_path / out).rglob("samples_*.jsonl")
        return {json.loads(line)["doc_id"]: json.loads(line)["resps"] for line in path.read_text().splitlines()}

    first = run("FP16", "first")
    assert len(list(tmp_path.glob("requests-pnmix-*_rank0.db"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("the model was asked for a response the cache holds")

    monkeypatch.setattr(lm_eval_model.PNMixLM, "_loglikelihood_tokens", refuse)
    assert run("FP16", "again") == first  # every response from the cache, the same numbers
    with pytest.raises(AssertionError, match="the cache holds"):
        run("PN-Mix", "other")  # another method: another database, so the model is asked
    assert len(list(tmp_path.glob("requests-pnmix-*_rank0.db"))) == 2
    assert "pnmix-lm-eval: request cache" in capsys.readouterr().err


@pytest.mark.long  # three fresh processes importing lm-eval and torch: about a minute on two CPU cores
def test_two_processes_score_as_one(tiny, tmp_path):
    """lm-eval's own multi-process launch (torchrun, as `accelerate launch` starts it): each process
    scores its share of the documents and rank 0 gathers them; every response equals one process's."""
    _tiny_task(tmp_path)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    env.pop("WORLD_SIZE", None)

    def run(launcher: list[str], out: str) -> dict:
        argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny},method=PN-Mix", "--tasks", "pnmix_tiny_cached"]
        argv += ["--include_path", str(tmp_path), "--output_path", str(tmp_path / out), "--log_samples"]
        ran = subprocess.run(
            [*launcher, "-m", "benchmarks.accuracy.lm_eval_cli", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        (path,) = (tmp_path / out).rglob("samples_*.jsonl")
        return {json.loads(line)["doc_id"]: json.loads(line)["resps"] for line in path.read_text().splitlines()}

    one = run([sys.executable], "one")
    two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"], "two")
    assert two == one and len(one) == 2


@pytest.fixture(scope="module")
def tiny16(tiny, tmp_path_factory) -> Path:
    """The tiny model at head_dim 16 (what the Triton kernels claim under the interpreter), its tokenizer."""
    import shutil

    import transformers

    folder = tmp_path_factory.mktemp("tiny16")
    for name in tiny.iterdir():
        if name.name.startswith("tokenizer") or name.name == "special_tokens_map.json":
            shutil.copy(name, folder / name.name)
    config = transformers.AutoConfig.from_pretrained(tiny)
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(1)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.interpreter
@pytest.mark.slow
def test_the_triton_implementation_scores_as_the_spec_within_its_own_low_precision_error(tiny16):
    """impl=triton on the evaluation path (under the interpreter here; on a GPU the default for every
    method): chunks stepwise and one pass per context, and its log-likelihoods as far from the float32
    spec as property 7 lets an attention be: twice the spec's own float16 error (about 1e-3 nats here),
    plus 1e-4 relative for the order of float sums."""
    args = {"pretrained": str(tiny16), "chunk": 4, **PAGES}
    spec32 = PNMixLM(method="PN-Mix", dtype="float32", **args)
    spec16 = PNMixLM(method="PN-Mix", dtype="float16", **args)
    triton = PNMixLM(impl="triton", dtype="float16", **args)
    assert triton.stepwise and triton.rewindable  # through the protocol's optional methods
    pairs = [(DOCUMENT + DECODE_MARK + QUESTION, c) for c in CONTINUATIONS]
    want, own, got = (lm.loglikelihood(requests("loglikelihood", *pairs)) for lm in (spec32, spec16, triton))
    for (w, _), (r, _), (g, _) in zip(want, own, got, strict=True):
        assert abs(g - w) <= 2 * abs(r - w) + 1e-4 * abs(w), (g, r, w)


def _other_model(folder: Path, tiny: Path, kind: str) -> Path:
    """A small random model folder of another kind, with the tiny model's tokenizer files."""
    import shutil

    import transformers

    folder.mkdir()
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, folder / f.name)
    if kind == "gpt2":  # a causal LM with learned positions, no RoPE
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=320))
    else:  # an encoder
        config = transformers.BertConfig(
            num_hidden_layers=1, num_attention_heads=2, hidden_size=32, intermediate_size=32, vocab_size=320
        )
        model = transformers.BertModel(config)
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("kind", "extra", "says"),
    [
        ("gpt2", "", "has no rotary position embedding (RoPE)"),
        ("bert", "", "has no rotary position embedding (RoPE)"),
        ("tiny", ",max_length=1000", "model_args max_length=1000: past the model's max_position_embeddings 256"),
    ],
)
def test_the_command_refuses_a_model_it_cannot_run_before_lm_eval_sets_up(
    tiny, tmp_path, capsys, monkeypatch, kind, extra, says
):
    from lm_eval._cli import HarnessCLI

    monkeypatch.setattr(HarnessCLI, "execute", lambda *a, **k: pytest.fail("refused before lm-eval sets up"))
    folder = tiny if kind == "tiny" else _other_model(tmp_path / kind, tiny, kind)
    argv = ["--model", "pnmix", "--model_args", f"pretrained={folder}{extra}", "--tasks", "hellaswag"]
    assert lm_eval_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pnmix-lm-eval: error: model_args ") and says in err[-1]


def test_a_pair_layout_given_in_model_args_reaches_the_caches(tiny, monkeypatch):
    import pnmix.hf

    monkeypatch.setattr(pnmix.hf, "detect_pair_layout", lambda config: None)  # a model whose layout cannot be told
    with pytest.raises(ModelArgsError, match="give pair_layout=split"):
        PNMixLM(pretrained=str(tiny), method="PN-Mix", **PAGES)
    lm = PNMixLM(pretrained=str(tiny), method="PN-Mix", pair_layout="split", chunk=4, **PAGES)
    text = DOCUMENT + QUESTION
    assert lm._new_cache(text, lm.tok_encode(text)).config.pair_layout == "split"
    (score,) = lm.loglikelihood(requests("loglikelihood", (DOCUMENT + DECODE_MARK + QUESTION, " 4213.")))
    assert math.isfinite(score[0])
    assert lm.record_prompt(lm.tok_encode(DOCUMENT))[0] is not None


def test_the_command_refuses_a_hub_task_it_cannot_download_before_the_model_loads(tiny, tmp_path, capsys, monkeypatch):
    import datasets.config
    from huggingface_hub import constants
    from lm_eval._cli import HarnessCLI

    monkeypatch.setattr(HarnessCLI, "execute", lambda *a, **k: pytest.fail("refused before lm-eval sets up"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    configs = str(ROOT / "benchmarks" / "tasks" / "configs")
    argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny}", "--include_path", configs, "--tasks"]
    assert lm_eval_cli.main([*argv, "pnmix_passkey_1k", "hellaswag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pnmix-lm-eval: error: --tasks: ['hellaswag'] read ['Rowan/hellaswag'] from the Hugging Face")
    assert "switched off" in err
    (tmp_path / "datasets" / "Rowan___hellaswag").mkdir(parents=True)  # downloaded before: lm-eval reads it
    monkeypatch.setattr(HarnessCLI, "execute", lambda *a, **k: None)
    assert lm_eval_cli.main([*argv, "hellaswag"]) == 0


@pytest.mark.slow  # six lm-eval runs of two documents in this process: about 15 s on two CPU cores
def test_simple_evaluates_request_cache_is_keyed_per_configuration_or_refused(tiny, tmp_path, monkeypatch):
    """The import route's use_cache=BASE: a database not keyed to the model's configuration is refused before
    any lookup (lm-eval keys a response by the request alone, so FP16's would be returned for PN-Mix); the
    one `cache_for` names is taken, a rerun reads every response from it, and another configuration is
    refused it."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    _tiny_task(tmp_path)
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    base = str(tmp_path / "requests")
    fp16 = {"pretrained": str(tiny), "method": "FP16"}
    pnmix = f"pretrained={tiny},method=PN-Mix," + ",".join(f"{k}={v}" for k, v in PAGES.items())

    def run(model_args, use_cache: str) -> list:
        out = lm_eval.simple_evaluate(
            model="pnmix", model_args=model_args, tasks=["pnmix_tiny_cached"], task_manager=manager, use_cache=use_cache
        )
        return [sample["resps"] for sample in out["samples"]["pnmix_tiny_cached"]]

    for model_args in (fp16, pnmix):  # one BASE for both: neither may read the other's responses
        with pytest.raises(lm_eval_model.UnkeyedCache, match=r"^use_cache: the request database \S+_rank0\.db is not"):
            run(model_args, base)
    keyed = {"FP16": lm_eval_model.cache_for(base, fp16), "PN-Mix": lm_eval_model.cache_for(base, pnmix)}
    assert keyed["FP16"] != keyed["PN-Mix"] and all(k.startswith(f"{base}-pnmix-") for k in keyed.values())
    with pytest.raises(lm_eval_model.UnkeyedCache, match=f"pass use_cache={keyed['FP16']} "):
        run(fp16, base)
    first = {"FP16": run(fp16, keyed["FP16"]), "PN-Mix": run(pnmix, keyed["PN-Mix"])}
    assert first["FP16"] != first["PN-Mix"]  # the marked document reads the quantized cache
    with pytest.raises(lm_eval_model.UnkeyedCache, match=f"pass use_cache={keyed['PN-Mix']} "):
        run(pnmix, keyed["FP16"])

    def refuse(*args, **kwargs):
        raise AssertionError("the model was asked for a response the cache holds")

    monkeypatch.setattr(lm_eval_model.PNMixLM, "_loglikelihood_tokens", refuse)
    assert run(fp16, keyed["FP16"]) == first["FP16"] and run(pnmix, keyed["PN-Mix"]) == first["PN-Mix"]


def _command(argv: list[str], tmp_path: Path, path: str | None = None) -> subprocess.CompletedProcess:
    """pnmix-lm-eval run as a user runs it (offline; `path` first on PYTHONPATH)."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (path, os.environ.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "benchmarks.accuracy.lm_eval_cli", *argv]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a fresh process: lm-eval sets up a task and loads the model, about 15 s on two CPU cores
def test_the_command_refuses_a_request_past_max_length_in_one_line(tiny, tmp_path):
    _tiny_task(tmp_path)
    argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny},method=FP16,max_length=16", "--tasks"]
    run = _command([*argv, "pnmix_tiny_cached", "--include_path", str(tmp_path)], tmp_path)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert last.startswith("pnmix-lm-eval: error: task pnmix_tiny_cached doc ") and "past max_length=16" in last


EXITING_PLUGIN = "import os\n\n\ndef make():\n    os._exit(0)  # a plug-in ending the process from its factory\n"


@pytest.mark.slow  # two fresh processes importing torch: about 10 s on two CPU cores
def test_the_command_refuses_a_plugin_that_exits_the_process_in_one_line(tiny, tmp_path):
    (tmp_path / "exiting_plugin.py").write_text(EXITING_PLUGIN)
    argv = ["--model", "pnmix", "--model_args", f"pretrained={tiny},impl=exiting_plugin:make", "--tasks", "x"]
    run = _command(argv, tmp_path, path=str(tmp_path))
    said = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 2 and len(said) == 1, said[-20:]
    assert said[0].startswith("pnmix-lm-eval: error: model_args impl=exiting_plugin:make: implementation ")
    assert "ended the process (exit status 0)" in said[0]


@pytest.mark.parametrize("command", [[], ["run"]])
def test_help_names_the_pnmix_model_its_model_args_and_the_methods(command, capsys):
    from reference import PNMixConfig, methods
    from reference.tokens.config import TokenPrecisionConfig

    with pytest.raises(SystemExit) as exit_:
        lm_eval_cli.main([*command, "--help"])
    said = " ".join(capsys.readouterr().out.split())  # the lines as one, wherever they wrap
    assert exit_.value.code == 0 and "--model pnmix --model_args pretrained=" in said
    options = [f.name for f in dataclasses.fields(Options) if f.name not in LM_EVAL_PASSES]
    fields = [f.name for cls in (PNMixConfig, TokenPrecisionConfig) for f in dataclasses.fields(cls)]
    missing = [
        name for name in [*options, *fields, *methods.REGISTRY] if not re.search(rf"\b{re.escape(name)}\b", said)
    ]
    assert not missing and "reference.methods.REGISTRY" in said
