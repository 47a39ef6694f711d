"""Whole-model architectures for the efficiency benchmarks, from the models' published config.json.

`reference.models` holds what the KV cache needs (layers, heads, head_dim); these add what the
weights and activations need. No download: the numbers are written here, with their source.
`Architecture.hf_config()` builds the matching transformers config, so a GPU benchmark can
instantiate the architecture with random weights, and a test can count its parameters
independently of `parameters()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.models import MODEL_SHAPES, ModelShape


@dataclass(frozen=True)
class Architecture:
    shape: ModelShape
    model_type: str  # transformers model_type: "qwen3", "llama", "qwen2"
    hidden: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qk_norm: bool  # Qwen3's per-head RMSNorm on q and k (head_dim weights each)
    qkv_bias: bool  # Qwen2's bias on the q, k and v projections
    rope_theta: float
    source: str

    @property
    def name(self) -> str:
        return self.shape.name

    def parameters(self) -> int:
        """Parameter count: embeddings, lm_head unless tied, attention, SwiGLU MLP, RMSNorms."""
        s, h = self.shape, self.hidden
        q_out, kv_out = s.query_heads * s.head_dim, s.kv_heads * s.head_dim
        attention = h * q_out + 2 * h * kv_out + q_out * h
        if self.qkv_bias:
            attention += q_out + 2 * kv_out
        if self.qk_norm:
            attention += 2 * s.head_dim
        layer = attention + 3 * h * self.intermediate + 2 * h  # + input and post-attention norms
        embeddings = self.vocab * h * (1 if self.tied_embeddings else 2)
        return embeddings + s.layers * layer + h  # + final norm

    def weight_bytes(self, bytes_per_parameter: int = 2) -> int:
        """Bytes of the weights in bf16/fp16 (2 bytes per parameter) unless told otherwise."""
        return self.parameters() * bytes_per_parameter

    def hf_config(self, **overrides):
        """The transformers config of this architecture (random-weight instantiation, parameter checks)."""
        from transformers import AutoConfig

        s = self.shape
        kwargs = {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.query_heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "tie_word_embeddings": self.tied_embeddings,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": 40960,
        }
        return AutoConfig.for_model(self.model_type, **{**kwargs, **overrides})


def _arch(name: str, model_type: str, hidden: int, intermediate: int, vocab: int, **flags) -> Architecture:
    return Architecture(
        shape=MODEL_SHAPES[name],
        model_type=model_type,
        hidden=hidden,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=flags.get("tied", False),
        qk_norm=model_type == "qwen3",
        qkv_bias=model_type == "qwen2",
        rope_theta=flags["rope_theta"],
        source=MODEL_SHAPES[name].source,
    )


ARCHITECTURES = {
    arch.name: arch
    for arch in (
        _arch("Qwen3-8B", "qwen3", 4096, 12288, 151936, rope_theta=1_000_000.0),
        _arch("Llama-3.1-8B", "llama", 4096, 14336, 128256, rope_theta=500_000.0),
        _arch("DeepSeek-R1-Distill-Qwen-7B", "qwen2", 3584, 18944, 152064, rope_theta=10_000.0),
        _arch("SmolLM2-135M", "llama", 576, 1536, 49152, tied=True, rope_theta=100_000.0),
    )
}


def tiny_architecture() -> Architecture:
    """A two-layer Qwen3 with the KV shape of a real model scaled down (GQA 2:1, head_dim 64):
    the CPU stand-in that exercises the GPU benchmarks' harness in seconds."""
    shape = ModelShape("tiny-qwen3", layers=2, query_heads=4, kv_heads=2, head_dim=64, source="synthetic")
    return Architecture(shape, "qwen3", 128, 256, 512, False, True, False, 1_000_000.0, "synthetic, for harness tests")
