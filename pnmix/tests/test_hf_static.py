"""PNMixHFCache preallocated to max_cache_len (the paper's static protocol), on a small random Qwen3."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

import pnmix.hf  # noqa: F401  (registers attn_implementation="pnmix")
from pnmix.hf import PNMixHFCache
from reference import PNMixConfig
from reference.methods import METHODS

SMALL_PAGES = PNMixConfig(group_size=8, residual_length=8, n_sink=4)


@pytest.fixture(scope="module")
def model():
    # Two layers, GQA 2:1, head_dim 64: a real model's KV shape scaled down.
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="pnmix").eval()


def test_static_preallocation_needs_the_triton_backend(model):
    with pytest.raises(ValueError, match=r"max_cache_len \(static preallocation\) needs backend='triton'"):
        PNMixHFCache(model.config, METHODS["PN-Mix"](), backend="reference", max_cache_len=64)


@pytest.mark.interpreter
def test_generation_fills_the_preallocated_cache_and_stops_at_its_end(model):
    prompt = torch.randint(0, model.config.vocab_size, (1, 13))
    capacity = 13 + 11  # sinks, two flushed pages, a partial residual
    cache = PNMixHFCache(model.config, SMALL_PAGES, backend="triton", max_cache_len=capacity)
    assert cache.layers[0].get_max_cache_shape() == capacity
    model.generate(
        input_ids=prompt,
        max_new_tokens=12,
        do_sample=False,
        past_key_values=cache,
        min_new_tokens=12,
        attention_mask=torch.ones_like(prompt),
    )
    assert all(layer.cache.capacity == capacity and layer.cache.length == capacity for layer in cache.layers)
    with pytest.raises(ValueError, match="max_cache_len"):
        cache.layers[0].cache.append(*(torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16),) * 2)


@pytest.mark.parametrize("value", [0, -1, 2.5, "64", True])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_a_max_cache_len_that_is_no_positive_int_is_refused_at_construction(model, value, backend):
    with pytest.raises(ValueError, match=rf"^max_cache_len={value!r}: expected a positive int") as error:
        PNMixHFCache(model.config, METHODS["PN-Mix"](), backend=backend, max_cache_len=value)
    assert "\n" not in str(error.value)
