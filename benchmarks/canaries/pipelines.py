"""Canaries of the transformers integration and the fixtures the tools' own canaries share, on the tiny
models of `workloads.LAYOUTS`.

- `hf(layout, name)`: the method `name` through `pnmix.hf.PNMixHFCache` (the reference backend, as every
  CPU tool runs it) on the tiny model of `layout`: a seeded prompt, then greedy decoding token by token.
  Exact: the chosen tokens; floats: the logits of every step.
- `implementation(name)`: a plug-in through `PNMixHFCache(impl=...)`, as `hf` runs a method.
- `save_tiny`, `ITEMS`, `GENERATE`, `numbers`: what the tools' canaries take from here.

Each tool's own canary lives in the tool, beside the code it stands for (`canary` and `PIPELINE` of
`benchmarks.fidelity.analyses`, `.long_output`, `.equal_bits`, `.role_calibration` and
`benchmarks.accuracy.task_accuracy`); nothing here imports a tool.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.canaries import workloads
from benchmarks.canaries.outcome import outcome, summary
from benchmarks.efficiency.plugins import load
from reference.methods import config as method_config
from reference.tokens.config import TokenPrecisionConfig

PROMPT, DECODE = 36, 12


@torch.no_grad()
def hf(layout: str, name: str) -> dict:
    import pnmix.hf as pnmix_hf  # deferred: transformers takes seconds to import

    model, exact = workloads.tiny_model(layout)
    head_dim = model.config.head_dim
    config = workloads.small_pages(method_config(name), head_dim)
    extra = {}
    if isinstance(config, TokenPrecisionConfig):
        extra["token_bits"] = workloads.token_bits(config, PROMPT, seed=4)
    cache = pnmix_hf.PNMixHFCache(model.config, config, backend="reference", **extra)
    model.set_attn_implementation(pnmix_hf.ATTENTION)
    ids = workloads.token_ids(seed=5, tokens=PROMPT)
    argument = pnmix_hf.cache_argument(model)
    logits, chosen = [], []
    step = ids
    for _ in range(DECODE):
        last = model(input_ids=step, use_cache=True, **{argument: cache}).logits[0, -1]
        logits.append(last)
        step = last.argmax()[None, None]
        chosen.append(int(step))
    model.set_attn_implementation(exact)
    return outcome({"tokens": chosen}, {"logits": summary(torch.stack(logits))})


#: The task-accuracy canary's characters (a character-level tokenizer: no training, the same on every machine).
CHARACTERS = " abcdefghijklmnopqrstuvwxyz0123456789.,?:"
#: (context, continuation) items scored, two sharing a context, and a generation request.
ITEMS = (
    ("the quick brown fox jumps over the lazy dog. question: what jumps?", " fox"),
    ("the quick brown fox jumps over the lazy dog. question: what jumps?", " dog"),
    ("a document about trains, boats and planes: 4213. passkey:", " 4213"),
)
GENERATE = ("numbers 0123 and 4567, then", {"until": ["."], "max_gen_toks": 8, "do_sample": False})


def save_tiny(folder: Path) -> Path:
    """The tiny Llama and a character tokenizer (BOS added), saved as a model folder."""
    import safetensors.torch
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2} | {c: i + 3 for i, c in enumerate(CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(folder)
    model, _ = workloads.tiny_model("llama")
    model.config.bos_token_id, model.config.eos_token_id = 0, 1
    # written directly: under a multi-process launch model.save_pretrained writes on rank 0 only, and every
    # process runs its own canaries
    model.config.save_pretrained(folder)
    safetensors.torch.save_model(model, str(folder / "model.safetensors"))
    return folder


#: The method an implementation's canary hands it (2-bit keys and values, as the sweep runs quanto).
IMPLEMENTATION_METHOD = "KIVI-2"


@torch.no_grad()
def implementation(name: str) -> dict:
    """An implementation loaded as the tools load it (`benchmarks.efficiency.plugins.load`), through
    `PNMixHFCache(impl=...)` on the tiny Llama, as `hf` runs a method."""
    import pnmix.hf as pnmix_hf  # deferred: transformers takes seconds to import

    plugin = load([name])[name]
    model, exact = workloads.tiny_model("llama")
    # 2-bit keys and values (as the sweep runs quanto, whose keys take 2 or 4 bits), mapped onto the
    # implementation's method by its preset (`Capabilities.configured`), small pages
    config = plugin.capabilities.configured(workloads.small_pages(method_config(IMPLEMENTATION_METHOD)))
    cache = pnmix_hf.PNMixHFCache(model.config, config, impl=plugin.impl)
    model.set_attn_implementation(pnmix_hf.ATTENTION)
    argument = pnmix_hf.cache_argument(model)
    logits, chosen, step = [], [], workloads.token_ids(seed=5, tokens=PROMPT)
    try:
        for _ in range(DECODE):
            last = model(input_ids=step, use_cache=True, **{argument: cache}).logits[0, -1]
            logits.append(last)
            step = last.argmax()[None, None]
            chosen.append(int(step))
    finally:
        model.set_attn_implementation(exact)
    return outcome({"tokens": chosen}, {"logits": summary(torch.stack(logits))})


def numbers(tree, prefix: str = "") -> dict[str, list[float]]:
    """Every number of a nested result, by its path (keys sorted): {path: [values]}."""
    out: dict[str, list[float]] = {}
    if isinstance(tree, dict):
        for key in sorted(tree, key=str):
            out |= numbers(tree[key], f"{prefix}/{key}")
    elif isinstance(tree, (list, tuple)) and tree and all(isinstance(x, (int, float)) for x in tree):
        out[prefix] = [float(x) for x in tree]
    elif isinstance(tree, (list, tuple)):
        for i, x in enumerate(tree):
            out |= numbers(x, f"{prefix}/{i}")
    elif isinstance(tree, (int, float)):
        out[prefix] = [float(tree)]
    return out
