"""The canaries' fixed inputs: seeded key/value/query tensors and tiny random transformers models whose
weights are drawn here from a seed (not by transformers' initialisers, so that a new release of transformers
that initialises differently does not change the workload)."""

from __future__ import annotations

import dataclasses
import math

import torch

from reference.channels.config import PNMixConfig
from reference.methods import EVERY_TOKEN
from reference.tokens.config import TokenPrecisionConfig

#: Batch, key/value heads, query heads, head dim, prompt tokens and appended tokens of the spec workload:
#: small pages (`PAGES`) so that a few dozen tokens fill, flush and slide every region.
B, H_KV, H_Q, D, PROMPT, APPENDS = 1, 2, 4, 64, 40, 24
PAGES = {"group_size": 16, "residual_length": 16}
SINKS = 4
TOKEN_GROUP = 16


def small_pages(config, head_dim: int = D):
    """A method's configuration with the canaries' small pages: G = N = 16 and at most 4 sinks (FP16 keeps
    every token exact, as it does anywhere)."""
    if isinstance(config, TokenPrecisionConfig):
        return dataclasses.replace(config, group_size=TOKEN_GROUP)
    assert isinstance(config, PNMixConfig)
    sinks = config.n_sink if config.n_sink >= EVERY_TOKEN else min(config.n_sink, SINKS)
    return dataclasses.replace(config, **PAGES, n_sink=sinks)


def qkv(seed: int = 0, tokens: int = PROMPT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded float32 q [B, H_Q, tokens, D], k and v [B, H_KV, tokens, D]; keys carry a few outlier channels
    (as real keys do, so that selection has something to choose)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H_Q, tokens, D, generator=g)
    k = torch.randn(B, H_KV, tokens, D, generator=g)
    k = k * (1 + 4 * (torch.arange(D) % 9 == 0).float())
    v = torch.randn(B, H_KV, tokens, D, generator=g)
    return q, k, v


def token_bits(config: TokenPrecisionConfig, tokens: int, seed: int) -> list[int]:
    """Seeded per-token bits for a per-token precision cache (high for about a third of the tokens)."""
    g = torch.Generator().manual_seed(seed)
    high = torch.rand(tokens, generator=g) < 0.35
    return [config.high_bits if h else config.low_bits for h in high.tolist()]


#: The tiny models, by attention layout: (config class, its arguments, the exact attention it is compared with).
VOCAB = 96
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
}
LAYOUTS = {
    "llama": ("LlamaConfig", {"num_hidden_layers": 2}, "sdpa"),
    # a local (sliding window 8) and a global layer, Gemma 3's scaling and norms
    "gemma3": (
        "Gemma3TextConfig",
        {"num_hidden_layers": 2, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]},
        "eager",
    ),
}


def seeded_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn from one seed, in name order: norms 1 + 0.1 N(0, 1), others N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda np: np[0]):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1 + 0.1 * noise if p.dim() == 1 else noise / math.sqrt(p.shape[-1]))
    return model


def tiny_model(layout: str):
    """(model in float32, eval mode, its exact attention), built from `LAYOUTS` with `seeded_weights`."""
    import transformers

    cls, extra, exact = LAYOUTS[layout]
    config = getattr(transformers, cls)(**COMMON, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=exact, dtype=torch.float32)
    return seeded_weights(model.eval()), exact


def token_ids(seed: int, tokens: int) -> torch.Tensor:
    """Seeded token ids [1, tokens] (above the first few ids, which tokenizers keep for special tokens)."""
    return torch.randint(3, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(seed))
