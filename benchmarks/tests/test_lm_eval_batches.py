"""lm-eval's --batch_size on the "pnmix" model: a batch of contexts scores and generates what one context at a time
does, each row's cache its own (`pnmix.ragged.RaggedBatch`), in fewer forwards of the model."""

import functools
import math

import pytest
import torch

pytest.importorskip("lm_eval")

from benchmarks.accuracy.lm_eval_model import DECODE_MARK, PNMixLM, largest_fitting
from benchmarks.accuracy.model_args import AUTO_START, ModelArgsError
from benchmarks.tests.conftest import CORPUS
from benchmarks.tests.test_lm_eval_model import PAGES, allocation, requests

#: Contexts of unlike lengths, with and without a decode section, one to four continuations each, an empty one.
PAIRS = [
    (CORPUS[0] + DECODE_MARK + " What moves?", c)
    for c in (" The fox.", " A boat", " planes and trains over the lazy dog", " x")
] + [
    (" ".join(CORPUS[:3]) + " Answer:", " 42"),
    (" ".join(CORPUS[:3]) + " Answer:", " the dog"),
    (CORPUS[1] + DECODE_MARK + " Say it again: " + CORPUS[1], " again"),
    ("", "The quick brown fox"),
    (" ".join(CORPUS[1:]) + DECODE_MARK, " and then some more words"),
    (CORPUS[2] + DECODE_MARK + " Next:", " 7"),
]

METHODS = [
    ({"method": "FP16", "chunk": 3}),
    ({"method": "PN-Mix", "chunk": 5, **PAGES}),
    ({"method": "KIVI-2", "chunk": 4, **PAGES}),
]


def _close(a: list, b: list) -> None:
    for (lp_a, greedy_a), (lp_b, greedy_b) in zip(a, b, strict=True):
        assert abs(lp_a - lp_b) <= 1e-4 and greedy_a == greedy_b, (lp_a, lp_b)


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("model_args", METHODS, ids=[m["method"] for m in METHODS])
def test_a_batch_scores_every_request_as_one_context_at_a_time(tiny, model_args, size):
    one = PNMixLM(pretrained=str(tiny), **model_args)
    batched = PNMixLM(pretrained=str(tiny), batch_size=size, **model_args)
    want = one.loglikelihood(requests("loglikelihood", *PAIRS))
    got = batched.loglikelihood(requests("loglikelihood", *PAIRS))
    assert len({round(lp, 3) for lp, _ in want}) > 5  # the requests differ: a row's answer in another's place shows
    _close(got, want)


def test_a_per_token_method_batches_each_rows_own_bits(tiny, tmp_path):
    args = {"method": "TriAxialKV", "allocation": str(allocation(tmp_path / "a.json")), "budget": 3.5}
    want = PNMixLM(pretrained=str(tiny), **args).loglikelihood(requests("loglikelihood", *PAIRS))
    got = PNMixLM(pretrained=str(tiny), batch_size=3, **args).loglikelihood(requests("loglikelihood", *PAIRS))
    _close(got, want)


def test_a_batch_makes_fewer_forwards_of_the_model(tiny, monkeypatch):
    """Where the time goes: each forward of the model reads its weights once for the whole batch."""
    counts = {}
    for size in (1, 4):
        lm = PNMixLM(pretrained=str(tiny), method="PN-Mix", batch_size=size, chunk=64, **PAGES)
        calls = []
        monkeypatch.setattr(lm.model, "forward", _counted(lm.model.forward, calls))
        lm.loglikelihood(requests("loglikelihood", *PAIRS))
        counts[size] = len(calls)
    # one context at a time: a prompt, a decode section where marked and a forward per continuation of 2+ tokens;
    # four rows a batch: the same forwards for all rows together, as many as the batch's busiest row needs
    assert counts[4] < 0.6 * counts[1], counts


def _counted(forward, calls: list):
    @functools.wraps(forward)  # the same signature: the cache argument's name is read from it
    def counted(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    return counted


def test_a_batch_generates_what_one_request_at_a_time_generates(tiny):
    asks = [
        (CORPUS[0] + DECODE_MARK + " What moves?", {"until": ["\n"], "max_gen_toks": 9}),
        (" ".join(CORPUS[:3]), {"until": [], "max_gen_toks": 4}),
        (CORPUS[2], {"until": ["the"], "max_gen_toks": 12}),
        (CORPUS[1] + DECODE_MARK + " Again:", {"until": [], "max_gen_toks": 1}),
        (CORPUS[2] + " " + CORPUS[0], {"until": [], "max_gen_toks": 7}),
    ]
    one = PNMixLM(pretrained=str(tiny), method="PN-Mix", chunk=4, **PAGES)
    batched = PNMixLM(pretrained=str(tiny), method="PN-Mix", chunk=4, batch_size=2, **PAGES)
    want = one.generate_until(requests("generate_until", *asks))
    assert batched.generate_until(requests("generate_until", *asks)) == want
    assert len({len(w) for w in want}) > 2  # rows stop at different steps


def test_rolling_windows_are_scored_in_batches(tiny):
    text = " ".join(CORPUS)
    one = PNMixLM(pretrained=str(tiny), method="PN-Mix", max_length=16, **PAGES)
    batched = PNMixLM(pretrained=str(tiny), method="PN-Mix", max_length=16, batch_size=4, **PAGES)
    (want,) = one.loglikelihood_rolling(requests("loglikelihood_rolling", (text,)))
    (got,) = batched.loglikelihood_rolling(requests("loglikelihood_rolling", (text,)))
    assert math.isclose(got, want, rel_tol=0, abs_tol=1e-4)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("auto:4", "batch_size='auto:4'"),
        (0, "batch_size=0"),
        ("-2", "batch_size='-2'"),
        ("many", "batch_size='many'"),
    ],
)
def test_a_bad_batch_size_is_refused_naming_it(tiny, value, names):
    with pytest.raises(ModelArgsError) as error:
        PNMixLM(pretrained=str(tiny), batch_size=value)
    assert names in str(error.value) and "positive int or 'auto'" in str(error.value)


def test_an_implementation_without_checkpoints_is_refused_a_batch(tiny):
    with pytest.raises(ModelArgsError, match=r"batch_size=2: the caches of impl=reports\.tests\.thirdparty:make"):
        PNMixLM(pretrained=str(tiny), impl="reports.tests.thirdparty:make", batch_size=2, **PAGES)


def test_auto_takes_max_batch_size_on_the_cpu_and_halves_on_cuda_out_of_memory(tiny):
    assert PNMixLM(pretrained=str(tiny), batch_size="auto").batch_size == AUTO_START
    assert PNMixLM(pretrained=str(tiny), batch_size="4").batch_size == 4
    assert PNMixLM(pretrained=str(tiny), batch_size="auto", max_batch_size=6).batch_size == 6
    tried = []

    def attempt(n: int) -> None:
        tried.append(n)
        if n > 5:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")

    assert largest_fitting(attempt, 64) == 4 and tried == [64, 32, 16, 8, 4]
    with pytest.raises(torch.cuda.OutOfMemoryError):
        largest_fitting(lambda n: attempt(10), 2)


def test_the_auto_trial_is_a_forward_of_max_length_prompts(tiny, monkeypatch):
    lm = PNMixLM(pretrained=str(tiny), batch_size="auto", max_batch_size=2, max_length=32)
    shapes = []
    monkeypatch.setattr(lm.model, "forward", _counted(lm.model.forward, shapes))
    lm._try_rows(3)
    assert [tuple(s) for s in shapes] == [(3, 32)]
