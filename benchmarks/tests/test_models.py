"""Architectures: the parameter count we compute equals the one transformers builds."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks.efficiency.architectures import ARCHITECTURES, tiny_architecture


@pytest.mark.parametrize("arch", [*ARCHITECTURES.values(), tiny_architecture()], ids=lambda a: a.name)
def test_parameter_count_matches_transformers(arch):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(arch.hf_config())
    assert arch.parameters() == sum(p.numel() for p in model.parameters())
    assert model.config.num_key_value_heads == arch.shape.kv_heads and model.config.head_dim == arch.shape.head_dim


def test_published_sizes():
    # Model cards: Qwen3-8B 8.2B, Llama-3.1-8B 8.03B, DeepSeek-R1-Distill-Qwen-7B 7.62B, SmolLM2-135M 135M.
    sizes = {name: round(a.parameters() / 1e9, 2) for name, a in ARCHITECTURES.items()}
    assert sizes == {"Qwen3-8B": 8.19, "Llama-3.1-8B": 8.03, "DeepSeek-R1-Distill-Qwen-7B": 7.62, "SmolLM2-135M": 0.13}
