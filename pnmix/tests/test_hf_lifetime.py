"""A PNMixHFCache is freed once nothing of the caller's holds it: a sweep that builds a cache per context and method
must not keep every earlier one alive (through a reference cycle that runs through a view's base, which C++ holds
and Python's garbage collector cannot see). Before the fix every method leaked this way through the sweep's path,
with or without an attention window."""

import gc
import weakref

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

import pnmix.hf as hf
from reference import PNMixConfig, methods

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 32}
PAGES = {"group_size": 8, "residual_length": 8, "n_sink": 2}  # so that a short prompt is quantized


def llama():
    config = LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=1)
    return LlamaForCausalLM(config)


def gemma_with_a_window():
    config = Gemma3TextConfig(
        **SMALL,
        num_hidden_layers=2,
        num_key_value_heads=1,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    return Gemma3ForCausalLM(config)


@pytest.mark.parametrize("stepwise", [False, True], ids=["attend", "stepwise"])
@pytest.mark.parametrize("build", [llama, gemma_with_a_window], ids=["llama", "gemma3-window"])
def test_a_cache_is_freed_once_nothing_holds_it(build, stepwise):
    torch.manual_seed(0)
    model = build().eval()
    model.set_attn_implementation(hf.ATTENTION)
    config = PNMixConfig(pair_layout="split", **PAGES)
    alive = []
    with torch.no_grad():
        for _ in range(2):
            cache = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=stepwise)
            ids = torch.randint(3, 64, (1, 30))
            model(input_ids=ids, **{hf.cache_argument(model): cache})  # the prompt
            model(input_ids=ids[:, :5], **{hf.cache_argument(model): cache})  # a chunk of decode steps
            model(input_ids=ids[:, :1], **{hf.cache_argument(model): cache})  # one step
            assert cache.layers[-1].cache is not None  # the quantized layer holds a packed cache
            alive.append(weakref.ref(cache))
            del cache
    gc.collect()
    assert [ref() is None for ref in alive] == [True, True]


@pytest.mark.parametrize("name", methods.names())
@pytest.mark.parametrize("build", [llama, gemma_with_a_window], ids=["llama", "gemma3-window"])
def test_the_sweeps_caches_are_freed_replayed_and_rolled_back(build, name):
    """As the accuracy sweep uses them: started from a recorded prompt forward (`replay_prefill`), a section
    decoded stepwise, continuations scored from a checkpoint and rolled back; every registry method."""
    torch.manual_seed(0)
    model = build().eval()
    model.set_attn_implementation(hf.ATTENTION)
    arg = hf.cache_argument(model)
    per_token = name in methods.names(precision=methods.TOKENS)
    config = methods.config(name, pair_layout="split", **({} if per_token else PAGES))
    ids = torch.randint(3, 64, (1, 40))
    alive = []
    with torch.no_grad():
        recorder = hf.PNMixHFCache(model.config, methods.config("FP16", pair_layout="split"), backend="reference")
        recorder.record_prefill()
        model(input_ids=ids[:, :30], **{arg: recorder})
        for _ in range(2):
            bits = {"token_bits": [4] * 30} if per_token else {}
            cache = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True, **bits)
            cache.replay_prefill(recorder.prefill)
            model(input_ids=ids[:, 30:], **{arg: cache})
            saved = cache.checkpoint()
            for end in (1, 3):
                model(input_ids=ids[:, :end], **{arg: cache})
                cache.roll_back(saved)
            alive.append(weakref.ref(cache))
            del cache, saved
    gc.collect()
    assert [ref() is None for ref in alive] == [True, True]
