"""PNMixHFCache on small random models of several RoPE families: attention windows (all layers or
local/global hybrids), logit softcapping and the model's own scaling give what the model gives
without PN-Mix, token for token, with the exact FP16 method; the RoPE pair layout is probed."""

import dataclasses
import importlib

import pytest
import torch

import pnmix.hf as hf
from reference import ReferenceCache
from reference.methods import METHODS

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
#: Where the Triton backend's tests run: the GPU where there is one (`benchmarks.gpu_check` runs them
#: there), else the CPU under the Triton interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (config class, extra arguments, the attention the model is compared with)
MODELS = {
    "llama": ("LlamaConfig", {}, "sdpa"),
    "mistral-window-8": ("MistralConfig", {"sliding_window": 8}, "sdpa"),
    "qwen2-window-8": (
        "Qwen2Config",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
        "sdpa",
    ),
    "gemma3-local-global": ("Gemma3TextConfig", {"sliding_window": 8}, "eager"),  # scaling 1/sqrt(256), not 1/4
    "gemma2-softcap": ("Gemma2Config", {"sliding_window": 8}, "eager"),  # softcapped logits, local/global
}


def build(name: str):
    import transformers

    cls, extra, exact = MODELS[name]
    config = getattr(transformers, cls)(**TINY, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=exact).eval()
    return model, exact


def generate(model, ids, cache=None, n=16):
    kwargs = {} if cache is None else {hf.cache_argument(model): cache}
    return model.generate(input_ids=ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kwargs)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_fp16_method_generates_what_the_model_generates(name):
    model, exact = build(name)
    ids = torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(1))  # past the window of 8
    expected = generate(model, ids)
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, METHODS["FP16"](), backend="reference")
    try:
        got = generate(model, ids, cache)
    finally:
        model.set_attn_implementation(exact)
    assert torch.equal(got, expected)
    # The window each layer was given: its own (local/global hybrids) or the model's, for every layer.
    cfg = model.config
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    kinds = getattr(cfg, "layer_types", None)
    windows = [window if kinds is None or kinds[i] == "sliding_attention" else None for i in range(len(cache.layers))]
    assert [layer.window for layer in cache.layers] == windows


@pytest.mark.parametrize("per_layer", [False, True], ids=["one-dict-5.18", "per-layer-5.19"])
def test_layer_windows_read_either_form_of_transformers_layer_arguments(monkeypatch, per_layer):
    """transformers <= 5.18 gives one dict of cache-layer arguments for every layer, 5.19 on a list, one per layer."""
    import transformers.cache_utils

    kinds = ["sliding_attention", "full_attention", "sliding_attention"]
    given = [{"sliding_window": 8}, {}, {"sliding_window": 8}] if per_layer else {"sliding_window": 8}
    monkeypatch.setattr(transformers.cache_utils, "get_layer_types_and_kwargs", lambda config: (kinds, given))
    assert hf.layer_windows(transformers.LlamaConfig(**TINY)) == [8, None, 8]
    kinds[1] = "chunked_attention"
    with pytest.raises(ValueError, match="layer 1 of this model is 'chunked_attention'"):
        hf.layer_windows(transformers.LlamaConfig(**TINY))


def test_windowed_layers_stay_exact_and_global_layers_are_quantized():
    model, exact = build("gemma3-local-global")
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    model.set_attn_implementation("pnmix")
    config = METHODS["PN-Mix"](group_size=8, residual_length=8, n_sink=4)
    cache = hf.PNMixHFCache(model.config, config, backend="reference")
    try:
        generate(model, ids, cache, n=4)
    finally:
        model.set_attn_implementation(exact)
    for layer, kind in zip(cache.layers, model.config.layer_types, strict=True):
        assert layer.get_seq_length() == 43  # the prompt and the 3 tokens fed back
        if kind == "sliding_attention":
            assert layer.cache is None and layer._exact[0].shape[2] == 7  # the last window - 1 tokens
        else:
            assert layer.window is None and layer.cache.layout.n_quantized == 32


def test_a_reset_cache_holds_nothing_and_serves_a_new_prompt_as_a_fresh_one():
    model, exact = build("gemma3-local-global")
    config = METHODS["PN-Mix"](group_size=8, residual_length=8, n_sink=4)
    first, second = (torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n)) for n in (30, 25))
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True)
    try:
        generate(model, first, cache, n=4)
        with torch.no_grad():  # stepwise chunks leave an exact tail on the global layers
            model(input_ids=torch.tensor([[5, 6, 7]]), **{hf.cache_argument(model): cache})
        cache.reset()
        held = {k: v for layer in cache.layers for k, v in vars(layer).items() if isinstance(v, torch.Tensor | tuple)}
        assert held == {} and cache.get_seq_length() == 0
        again = generate(model, second, cache, n=4)
        fresh = generate(model, second, hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True), n=4)
    finally:
        model.set_attn_implementation(exact)
    assert torch.equal(again, fresh)


def test_the_pair_layout_is_probed_from_the_rotary_function(monkeypatch):
    model, _ = build("llama")
    assert hf.detect_pair_layout(model.config) == "split"
    module = importlib.import_module(type(model).__module__)

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # GPT-J style: pairs (2i, 2i + 1)
        def rotate(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin

    monkeypatch.setattr(module, "apply_rotary_pos_emb", interleaved)
    assert hf.detect_pair_layout(model.config) == "adjacent"
    with pytest.raises(ValueError, match="contradicts the model's 'adjacent' RoPE layout"):
        hf.PNMixHFCache(model.config, METHODS["PN-Mix"](), pair_layout="split")
    monkeypatch.setattr(module, "apply_rotary_pos_emb", lambda q, k, cos, sin: (q, k))  # no rotation at all
    assert hf.detect_pair_layout(model.config) is None


def test_attention_arguments_it_cannot_honour_are_named():
    model, _ = build("llama")
    cache = hf.PNMixHFCache(model.config, METHODS["FP16"](), backend="reference")
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    k, v = cache.layers[0].update(k, k.clone())
    with pytest.raises(ValueError, match="attention argument s_aux="):
        hf.pnmix_attention(None, q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match=r"dropout=0\.1 cannot be honoured"):
        hf.pnmix_attention(None, q, k, v, None, dropout=0.1)
    out, _ = hf.pnmix_attention(None, q, k, v, None, output_router_logits=False, position_ids=torch.arange(3))
    assert out.shape == (1, 3, 4, 16)


def test_softcap_on_a_quantized_layer_is_refused_by_the_triton_backend():
    from pnmix import PNMixCache, _runtime

    t = torch.randn(1, 2, 12, 16, generator=torch.Generator().manual_seed(3)).half().to(_runtime.kernel_device())
    cache = PNMixCache.from_prefill(torch.cat([t, t], 1), t, t, dataclasses.replace(METHODS["FP16"]()))
    with pytest.raises(ValueError, match=r"softcap=50\.0: the Triton decode kernel"):
        cache.attend(torch.cat([t, t], 1)[:, :, -1:], softcap=50.0)


def test_the_window_is_read_from_the_mask_the_model_builds():
    from transformers import masking_utils as mu

    assert hf.pnmix_mask(1, 4, 4, mask_function=mu.causal_mask_function) == hf.LayerMask(None)
    sliding = mu.sliding_window_causal_mask_function(12)
    assert hf.pnmix_mask(1, 4, 4, mask_function=sliding, local_size=12) == hf.LayerMask(12)
    with pytest.raises(ValueError, match="not causal over a window of 12"):  # a window other than claimed
        hf.pnmix_mask(1, 4, 4, mask_function=mu.sliding_window_causal_mask_function(13), local_size=12)
    chunked = mu.chunked_causal_mask_function(16, torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="chunked or bidirectional attention"):
        hf.pnmix_mask(1, 4, 4, mask_function=chunked, local_size=16)
    with pytest.raises(ValueError, match="not causal"):
        hf.pnmix_mask(1, 4, 4, mask_function=mu.bidirectional_mask_function)


@pytest.mark.parametrize("method", ["PN-Mix", "KIVI-2", "Kitty"])
def test_stepwise_chunks_give_the_logits_of_token_by_token_decoding(method):
    model, _ = build("llama")
    model.set_attn_implementation("pnmix")
    config = METHODS[method](group_size=8, residual_length=8, n_sink=2)
    ids = torch.randint(3, 128, (1, 60), generator=torch.Generator().manual_seed(4))
    one = hf.PNMixHFCache(model.config, config, backend="reference")
    chunked = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True)
    with torch.no_grad():
        model(input_ids=ids[:, :12], **{hf.cache_argument(model): one})
        model(input_ids=ids[:, :12], **{hf.cache_argument(model): chunked})
        expected = torch.cat(
            [model(input_ids=ids[:, t : t + 1], **{hf.cache_argument(model): one}).logits for t in range(12, 60)], 1
        )
        got = torch.cat(
            [
                model(input_ids=ids[:, a : a + 16], **{hf.cache_argument(model): chunked}).logits
                for a in range(12, 60, 16)
            ],
            1,
        )
        plain = hf.PNMixHFCache(model.config, config, backend="reference")  # chunks without stepwise
        model(input_ids=ids[:, :12], **{hf.cache_argument(model): plain})
        wrong = torch.cat(
            [
                model(input_ids=ids[:, a : a + 16], **{hf.cache_argument(model): plain}).logits
                for a in range(12, 60, 16)
            ],
            1,
        )
    torch.testing.assert_close(got, expected)  # float32 model: equal up to the order of float32 sums
    assert not torch.allclose(wrong, expected), "chunks attending after their whole append should differ"
    lacking = hf.PNMixHFCache(model.config, config, impl=RequiredOnly(), stepwise=True)
    with torch.no_grad(), pytest.raises(ValueError, match="have no attend_stepwise"):
        model(input_ids=ids[:, :12], **{hf.cache_argument(model): lacking})


class RequiredOnly:
    """An implementation whose caches have the required protocol alone (no optional methods)."""

    name = "required-only"

    class Cache:
        OPTIONAL = ("attend_stepwise", "checkpoint", "roll_back", "release")

        def __init__(self, cache) -> None:
            self._cache = cache

        def __getattr__(self, name: str):
            if name in self.OPTIONAL:
                raise AttributeError(name)
            return getattr(self._cache, name)

    def create(self, config):
        return self.Cache(ReferenceCache(config))


def _decode(model, cache, ids, prompt: int, chunk: int) -> torch.Tensor:
    """Logits [1, T - prompt, vocab] (float32) after the prompt, fed `chunk` tokens a forward."""
    arg = hf.cache_argument(model)
    with torch.no_grad():
        model(input_ids=ids[:, :prompt], **{arg: cache})
        steps = range(prompt, ids.shape[1], chunk)
        return torch.cat([model(input_ids=ids[:, a : a + chunk], **{arg: cache}).logits for a in steps], 1).float()


# a minute a method under the interpreter: `long` here (property 12 checks the Triton caches' stepwise attention
# in the test command); `gpu_check --short` runs both on a GPU
@pytest.mark.long
@pytest.mark.parametrize("method", ["PN-Mix", "KIVI-2"])
def test_the_triton_backend_decodes_chunks_stepwise_as_token_by_token(method):
    """stepwise on the Triton caches (`pnmix.PNMixCache.attend_stepwise`: the spec's rule over its own
    codes; one token is the decode kernel): chunks give the logits of the kernel's token-by-token
    decoding, within the float16 roundings of reading dequantized codes in another order."""
    model, _ = build("llama")
    model = model.to(DEVICE, torch.float16)
    model.set_attn_implementation("pnmix")
    config = METHODS[method](group_size=8, residual_length=8, n_sink=2)
    # 12 decoded tokens (each a kernel launch per layer under the interpreter): two pages flush inside a chunk
    ids = torch.randint(3, 128, (1, 26), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    one = _decode(model, hf.PNMixHFCache(model.config, config, backend="triton"), ids, 14, 1)
    chunked = _decode(model, hf.PNMixHFCache(model.config, config, backend="triton", stepwise=True), ids, 14, 12)
    plain = _decode(model, hf.PNMixHFCache(model.config, config, backend="triton"), ids, 14, 12)
    atol = 8 * torch.finfo(torch.float16).eps * float(one.abs().max())
    torch.testing.assert_close(chunked, one, rtol=0, atol=atol)
    assert (plain - one).abs().max() > atol, "chunks attending after their whole append should differ"


def test_a_triton_cache_rolls_back_to_one_checkpoint_any_number_of_times():
    """The continuations of one context each return to the same checkpoint (`PNMixHFCache.checkpoint`):
    on the Triton caches every return gives the logits of the first pass, bit for bit."""
    model, _ = build("llama")
    model = model.to(DEVICE, torch.float16)
    model.set_attn_implementation("pnmix")
    config = METHODS["PN-Mix"](group_size=8, residual_length=8, n_sink=2)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    cache, arg = hf.PNMixHFCache(model.config, config, backend="triton", stepwise=True), hf.cache_argument(model)
    with torch.no_grad():
        model(input_ids=ids[:, :14], **{arg: cache})
        saved = cache.checkpoint()
        runs = []
        for _ in range(3):  # 26 tokens: pages flush past the checkpoint every time
            runs.append(model(input_ids=ids[:, 14:], **{arg: cache}).logits)
            assert cache.get_seq_length() == 40
            cache.roll_back(saved)
            assert cache.get_seq_length() == 14
    assert all(torch.equal(r, runs[0]) for r in runs[1:])


def test_chunked_decoding_differs_from_token_by_token_only_by_codes_on_a_rounding_boundary(monkeypatch):
    """Chunked decoding (stepwise=True) reads what token-by-token decoding reads, except that the model
    computes a chunk's keys with other float sums: a key may then round to the other code of a
    quantization boundary when its page flushes. Every code that differs is such a code: its
    position between two levels, (k - zero) / scale, is within 0.01 of the boundary in one run,
    and it moved by one level; the keys themselves differ by float rounding only."""
    pages = {}
    flush = ReferenceCache._flush_keys

    def recorded(self, k):
        pages.setdefault(id(self), []).append(k.float())
        return flush(self, k)

    monkeypatch.setattr(ReferenceCache, "_flush_keys", recorded)
    model, _ = build("llama")
    model.set_attn_implementation("pnmix")
    config = METHODS["KIVI-2"](group_size=8, residual_length=8, n_sink=2)
    ids = torch.randint(3, 128, (1, 76), generator=torch.Generator().manual_seed(7))
    one = hf.PNMixHFCache(model.config, config, backend="reference")
    chunked = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True)
    with torch.no_grad():
        for cache, step in ((one, 1), (chunked, 16)):
            model(input_ids=ids[:, :12], **{hf.cache_argument(model): cache})
            for a in range(12, 76, step):
                model(input_ids=ids[:, a : a + step], **{hf.cache_argument(model): cache})
    flipped = 0
    for a, b in zip(one.layers, chunked.layers, strict=True):
        keys_a, keys_b = torch.cat(pages[id(a.cache)], 2), torch.cat(pages[id(b.cache)], 2)
        assert keys_a.shape == keys_b.shape and keys_a.shape[2] > 0
        assert (keys_a - keys_b).abs().max() <= 1e-4 * keys_a.abs().max()  # float rounding, no other tokens
        codes_a, codes_b = a.cache.key_codes().codes.long(), b.cache.key_codes().codes.long()
        differ = codes_a != codes_b
        assert (codes_a - codes_b).abs().max() <= 1
        scale = a.cache._t["key_scale"].float().repeat_interleave(config.group_size, dim=2)
        zero = a.cache._t["key_zero"].float().repeat_interleave(config.group_size, dim=2)
        between = (keys_a - zero) / scale + 0.5  # a code is floor(between): boundaries at whole numbers
        to_boundary = (between - between.round()).abs()
        assert bool((to_boundary[differ] <= 0.01).all()), f"codes differ away from a boundary: {to_boundary[differ]}"
        flipped += int(differ.sum())
    assert flipped < 0.01 * sum(layer.cache.key_codes().codes.numel() for layer in one.layers)


class FailOnce:
    """Wraps a method so that its `at`-th call (0-based) raises an out-of-memory error."""

    def __init__(self, monkeypatch, owner, name: str, at: int) -> None:
        self.calls, self.at, original = 0, at, getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.calls += 1
            if self.calls - 1 == self.at:
                raise torch.OutOfMemoryError(f"injected at call {self.at} of {name}")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)


def _logits(model, ids, cache):
    with torch.no_grad():
        return model(input_ids=ids, **{hf.cache_argument(model): cache}).logits


def _pnmix_llama():
    model, _ = build("llama")
    model.set_attn_implementation("pnmix")
    return model, METHODS["PN-Mix"](group_size=8, residual_length=8, n_sink=2)


@pytest.mark.parametrize("where", ["prefill", "append", "mlp"])
@pytest.mark.parametrize("layer", [0, 2])
def test_a_failed_forward_leaves_every_layer_as_it_was(monkeypatch, where, layer):
    """A fault in the third layer's cache update, or in a layer's MLP (outside PN-Mix), fails the
    forward; the cache then answers the next forward as a cache that never saw it."""
    from reference import ReferenceCache

    model, config = _pnmix_llama()
    ids = torch.randint(3, 128, (1, 30), generator=torch.Generator().manual_seed(9))
    clean, cache = (hf.PNMixHFCache(model.config, config, backend="reference") for _ in range(2))
    expected = [_logits(model, ids[:, :20], clean), _logits(model, ids[:, 20:21], clean)]
    if where != "prefill":
        _logits(model, ids[:, :20], cache)
    owner, name = {
        "prefill": (ReferenceCache, "prefill"),
        "append": (ReferenceCache, "append"),
        "mlp": (type(model.model.layers[layer].mlp), "forward"),
    }[where]
    fault = FailOnce(monkeypatch, owner, name, at=layer)
    with pytest.raises(torch.OutOfMemoryError, match="injected"):
        _logits(model, ids[:, :20] if where == "prefill" else ids[:, 20:21], cache)
    assert fault.calls == layer + 1
    if where == "prefill":
        assert cache.get_seq_length() == 0 and all(not lay.started for lay in cache.layers)
        torch.testing.assert_close(_logits(model, ids[:, :20], cache), expected[0], rtol=0, atol=0)
    torch.testing.assert_close(_logits(model, ids[:, 20:21], cache), expected[1], rtol=0, atol=0)
    assert [lay.get_seq_length() for lay in cache.layers] == [21] * len(cache.layers)


def test_a_refused_prefill_can_be_retried(monkeypatch):
    """The Triton backend refuses a float32 model at prefill; the cache stays empty, not broken."""
    model, config = _pnmix_llama()
    cache = hf.PNMixHFCache(model.config, config, backend="triton")
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    for _ in range(2):  # the same clear error each time, not "the cache is empty"
        with pytest.raises(TypeError, match="float16 or bfloat16"):
            _logits(model, ids, cache)
        assert cache.get_seq_length() == 0 and all(not lay.started for lay in cache.layers)


def test_a_model_whose_attention_bypasses_the_interface_is_refused_by_name():
    """A model that attends on its own (here: eager attention instead of "pnmix") would read only
    the new tokens the update returns; the next layer's update says so and nothing is kept."""
    model, config = _pnmix_llama()
    model.set_attn_implementation("eager")
    cache = hf.PNMixHFCache(model.config, config, backend="reference")
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="PN-Mix: the model did not run attn_implementation='pnmix'"):
            _logits(model, ids, cache)
        assert cache.get_seq_length() == 0 and all(not lay.started for lay in cache.layers)


@pytest.mark.parametrize("low_keys", ["channels", "pairs"])
def test_per_token_precision_generates_and_its_stepwise_chunks_are_token_by_token(low_keys):
    from reference.tokens.config import TokenPrecisionConfig, token_classes

    model, _ = build("llama")
    model.set_attn_implementation("pnmix")
    d = model.config.hidden_size // model.config.num_attention_heads
    config = TokenPrecisionConfig(group_size=8 if d % 16 else 16, low_keys=low_keys)
    ids = torch.randint(3, 128, (1, 70), generator=torch.Generator().manual_seed(5))
    bits = torch.where(torch.rand(70, generator=torch.Generator().manual_seed(6)) < 0.75, 2, 4)
    arg = hf.cache_argument(model)

    def cache(**kw):
        return hf.PNMixHFCache(model.config, config, backend="reference", token_bits=bits, **kw)

    one, chunked, plain = cache(), cache(stepwise=True), cache()
    with torch.no_grad():
        for c in (one, chunked, plain):
            model(input_ids=ids[:, :12], **{arg: c})
        expected = torch.cat([model(input_ids=ids[:, t : t + 1], **{arg: one}).logits for t in range(12, 70)], 1)
        got = torch.cat([model(input_ids=ids[:, a : a + 20], **{arg: chunked}).logits for a in range(12, 70, 20)], 1)
        wrong = torch.cat([model(input_ids=ids[:, a : a + 20], **{arg: plain}).logits for a in range(12, 70, 20)], 1)
    torch.testing.assert_close(got, expected)  # float32 model: equal up to the order of float32 sums
    assert not torch.allclose(wrong, expected), "chunks attending after their whole append should differ"
    layer = one.layers[0].cache
    assert torch.equal(layer.token_bits(), bits) and token_classes(config, bits).n_grouped > 0
    # generate(): the prompt's bits from token_bits, every generated token at generated_bits
    gen = hf.PNMixHFCache(model.config, config, token_bits=bits[:20], generated_bits=2)
    out = model.generate(input_ids=ids[:, :20], max_new_tokens=10, do_sample=False, **{arg: gen})
    assert out.shape == (1, 30)
    held = gen.layers[0].cache.token_bits()
    assert torch.equal(held[:20], bits[:20]) and bool((held[20:] == 2).all()) and len(held) == 29
    with pytest.raises(ValueError, match="static preallocation is not supported"):
        hf.PNMixHFCache(model.config, config, backend="triton", max_cache_len=128)
    with pytest.raises(ValueError, match=r"generated_bits must hold only \(2, 4\)"):
        hf.PNMixHFCache(model.config, config, generated_bits=3)
    with pytest.raises(ValueError, match="token_bits and generated_bits are for a per-token precision config"):
        hf.PNMixHFCache(model.config, METHODS["PN-Mix"](), token_bits=bits)


@pytest.mark.interpreter
def test_per_token_precision_decodes_through_the_triton_kernel_as_through_the_spec():
    from reference.tokens.config import TokenPrecisionConfig

    model, _ = build("llama")
    model = model.to(torch.float16)
    model.set_attn_implementation("pnmix")
    d = model.config.hidden_size // model.config.num_attention_heads
    config = TokenPrecisionConfig(group_size=8 if d % 16 else 16, low_keys="pairs")
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(7))
    bits = torch.where(torch.rand(40, generator=torch.Generator().manual_seed(8)) < 0.75, 2, 4)
    arg = hf.cache_argument(model)
    logits = {}
    for backend in ("reference", "triton"):
        cache = hf.PNMixHFCache(model.config, config, backend=backend, token_bits=bits)
        with torch.no_grad():
            model(input_ids=ids[:, :30], **{arg: cache})
            logits[backend] = torch.cat(
                [model(input_ids=ids[:, t : t + 1], **{arg: cache}).logits for t in range(30, 40)], 1
            ).float()
        assert type(cache.layers[0].cache).__name__ == (
            "TritonTokenPrecisionCache" if backend == "triton" else "TokenPrecisionCache"
        )
    # float16 model: the kernel rounds dequantized keys and values to float16 (property 7's bound allows it),
    # which moves the logits by a few float16 roundings at their scale (0.4e-3 of 0.5 when written)
    ref = logits["reference"]
    torch.testing.assert_close(
        logits["triton"], ref, rtol=0, atol=4 * torch.finfo(torch.float16).eps * float(ref.abs().max())
    )


def test_a_cache_built_from_another_models_config_is_refused():
    model, _ = build("llama")  # 4 layers
    model.set_attn_implementation("pnmix")
    config = METHODS["PN-Mix"](group_size=8, residual_length=8, n_sink=2)
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    for layers in (2, 6):  # fewer: a layer it does not have; more: layers no forward reaches
        other = type(model.config)(**{**model.config.to_dict(), "num_hidden_layers": layers, "layer_types": None})
        cache = hf.PNMixHFCache(other, config)
        said = rf"(built for {layers} layers|this model has 4 cache layers and its PNMixHFCache {layers}:)"
        with torch.no_grad(), pytest.raises(ValueError, match=said):
            model(input_ids=ids, **{hf.cache_argument(model): cache})
        assert cache.get_seq_length() == 0


def test_a_model_without_rope_is_refused_even_with_a_pair_layout():
    import transformers

    gpt2 = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32)
    with pytest.raises(ValueError, match="has no rotary position embedding"):
        hf.PNMixHFCache(gpt2, METHODS["PN-Mix"](), pair_layout="split")


class NaNAttention(RequiredOnly):
    """An implementation whose attention returns NaN in one layer's cache (the third it creates)."""

    name = "nan-attention"

    def __init__(self) -> None:
        self.made = 0

    def create(self, config):
        cache, self.made = super().create(config), self.made + 1
        if self.made == 3:
            cache.attend = lambda q: torch.full_like(q, float("nan"))
        return cache


def test_an_implementation_whose_attention_returns_nan_is_named_with_its_layer():
    model, _ = build("llama")  # 4 layers
    model.set_attn_implementation("pnmix")
    config = METHODS["PN-Mix"](group_size=8, residual_length=8, n_sink=2)
    ids = torch.randint(3, 128, (1, 14), generator=torch.Generator().manual_seed(5))
    cache = hf.PNMixHFCache(model.config, config, impl=NaNAttention())
    arg = hf.cache_argument(model)
    with torch.no_grad():
        model(input_ids=ids[:, :12], **{arg: cache})  # the prompt: exact attention
        with pytest.raises(ValueError, match=r"attention of impl='nan-attention' at layer 2 returned NaN or Inf"):
            model(input_ids=ids[:, 12:13], **{arg: cache})
    assert cache.get_seq_length() == 12  # the failed step is rolled back
