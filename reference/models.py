"""Attention shapes of the models the paper evaluates, from their published config.json files.

Only what the KV cache needs is here; benchmarks extend these with the rest of the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    query_heads: int
    kv_heads: int
    head_dim: int
    source: str


MODEL_SHAPES = {
    shape.name: shape
    for shape in (
        ModelShape("Qwen3-8B", 36, 32, 8, 128, "Qwen/Qwen3-8B config.json"),
        ModelShape("Llama-3.1-8B", 32, 32, 8, 128, "meta-llama/Llama-3.1-8B config.json"),
        ModelShape(
            "DeepSeek-R1-Distill-Qwen-7B", 28, 28, 4, 128, "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B config.json"
        ),
        ModelShape("SmolLM2-135M", 30, 9, 3, 64, "HuggingFaceTB/SmolLM2-135M-Instruct config.json"),
    )
}
