"""A PNMixHFCache is freed once nothing of the caller's holds it: a sweep that builds a cache per context and method
must not keep every earlier one alive (through a reference cycle that runs through a view's base, which C++ holds
and Python's garbage collector cannot see)."""

import gc
import weakref

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

import pnmix.hf as hf
from reference import PNMixConfig

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 16}
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
