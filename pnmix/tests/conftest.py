"""Fixtures shared by the package's tests."""

from __future__ import annotations

import pytest
import torch

from pnmix import _runtime


@pytest.fixture(scope="module")
def tiny_qwen3():
    """A small random Qwen3 in float16 on the kernels' device, attending through PN-Mix: two layers,
    GQA 2:1, head_dim 16."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from pnmix.hf import ATTENTION

    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float16, attn_implementation=ATTENTION)
    return model.eval().to(_runtime.kernel_device())
