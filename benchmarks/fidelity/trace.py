"""Tracing a real model: the post-RoPE queries and keys of every layer and KV head, recorded during
prefill and greedy generation (the input of every fidelity analysis)."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.models.chat_format import MODEL_TEMPLATE, ChatFormat

DATA = Path(__file__).parents[1] / "data"
TRACE = "pnmix-trace"
LAYOUT = "split"  # SmolLM2 (Llama) uses rotate_half; main() probes the model's own (pnmix.hf.detect_pair_layout)


def register_tracer() -> None:
    """attn_implementation="pnmix-trace": SDPA that also records post-RoPE q and the new k."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def traced(module, query, key, value, attention_mask, **kwargs):
        record = getattr(module, "_pnmix_trace", None)
        if record is not None:
            record.append((query[0].detach().float().clone(), key[0, :, -query.shape[2] :].detach().float().clone()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(TRACE, traced)
    AttentionMaskInterface.register(TRACE, sdpa_mask)


def chat_ids(tokenizer, prompt: str, fmt: ChatFormat = MODEL_TEMPLATE) -> dict:
    """The input ids (and attention mask) of a one-turn chat asking `prompt`, formatted by `fmt`."""
    return fmt.encode(tokenizer, fmt.render(tokenizer, [{"role": "user", "content": prompt}]), return_tensors="pt")


@torch.no_grad()
def collect(model, tokenizer, prompt: str, new_tokens: int, fmt: ChatFormat = MODEL_TEMPLATE):
    """Per layer (q [H, T, d], k [H_kv, T, d]) over prompt + generation, the prompt length, and the tokens."""
    layers = [layer.self_attn for layer in model.model.layers]
    for attn in layers:
        attn._pnmix_trace = []
    inputs = chat_ids(tokenizer, prompt, fmt)
    out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    traces = [
        (torch.cat([q for q, _ in a._pnmix_trace], 1), torch.cat([k for _, k in a._pnmix_trace], 1)) for a in layers
    ]
    for attn in layers:
        del attn._pnmix_trace
    return traces, inputs["input_ids"].shape[1], out[0]
