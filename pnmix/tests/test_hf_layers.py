"""What transformers' tools read from a cache's layers, as `DynamicCache` gives it: each layer's `keys` and
`values` (here what the layer holds, dequantized) and `get_max_length` (a windowed layer's window), on a
global-attention family and on one that alternates sliding-window and global layers."""

import copy
import dataclasses

import pytest
import torch
from transformers import DynamicCache

import pnmix.hf as hf
from pnmix.tests.test_hf_families import generate, small_model
from reference.contract.implementation import ReferenceImplementation
from reference.methods import METHODS

FAMILIES = [("llama", {}), ("gemma2", {"sliding_window": 8})]
#: The model configurations on which transformers' own cache behaviours are checked against `DynamicCache`: besides
#: the two above (Gemma 2 with its logit softcapping and a window), Qwen2, Gemma and an MQA Llama (one KV head).
CONFIGURATIONS = [*FAMILIES, ("qwen2", {}), ("gemma", {}), ("llama", {"num_key_value_heads": 1})]
CONFIGURATION_IDS = ["llama", "gemma2-window", "qwen2", "gemma", "llama-mqa"]


def _config(model, method: str):
    config = dataclasses.replace(METHODS[method](), pair_layout=hf.detect_pair_layout(model.config))
    if method != "FP16":  # small pages, so that 20 + 11 tokens fill some
        config = dataclasses.replace(config, group_size=8, residual_length=8, n_sink=4)
    return config


def _run(model_type: str, extra: dict, method: str, **generation):
    model = small_model(model_type, **extra)
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    dynamic = DynamicCache(config=model.config)
    expected = generate(model, ids, dynamic, **generation)
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, _config(model, method), backend="reference")
    got = generate(model, ids, cache, **generation)
    return expected, dynamic, got, cache


@pytest.mark.parametrize(("model_type", "extra"), CONFIGURATIONS, ids=CONFIGURATION_IDS)
def test_fp16_layers_hold_what_dynamic_caches_layers_hold(model_type, extra):
    expected, dynamic, got, cache = _run(model_type, extra, "FP16")
    assert torch.equal(got, expected)
    assert cache.get_max_length() == dynamic.get_max_length()
    assert any(layer.is_sliding for layer in dynamic.layers) == ("sliding_window" in extra)
    for i, (mine, theirs) in enumerate(zip(cache.layers, dynamic.layers, strict=True)):
        assert mine.get_max_length() == theirs.get_max_length(), f"layer {i}"
        if i == 0:  # the same inputs: the same tensors
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
        else:  # later layers' inputs carry the attention's float32 rounding (another summation order), not the cache's
            torch.testing.assert_close(mine.keys, theirs.keys, msg=f"layer {i}")
            torch.testing.assert_close(mine.values, theirs.values, msg=f"layer {i}")


@pytest.mark.parametrize(("model_type", "extra"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_quantized_layers_hold_their_dequantized_pages(model_type, extra):
    _, dynamic, _, cache = _run(model_type, extra, "PN-Mix")
    for i, (mine, theirs) in enumerate(zip(cache.layers, dynamic.layers, strict=True)):
        assert mine.keys.shape == theirs.keys.shape and mine.keys.dtype == theirs.keys.dtype, f"layer {i}"
        if mine.cache is not None:  # a global layer: its packed pages read back, in the model's dtype
            k, v = mine.cache.dequantize()
            assert torch.equal(mine.keys, k.to(mine.keys.dtype)) and torch.equal(mine.values, v.to(mine.values.dtype))
            assert mine.cache.layout.n_quantized > 0
    with pytest.raises(AttributeError, match="write through update"):
        cache.layers[0].keys = torch.zeros(1)


def test_a_layer_holds_nothing_before_its_first_update():
    layer = hf.PNMixLayer(METHODS["FP16"](), "reference")
    assert layer.keys is None and layer.values is None and layer.get_max_length() == -1
    assert hf.PNMixLayer(METHODS["FP16"](), "reference", window=16).get_max_length() == 16


BEAMS = {"num_beams": 3, "num_return_sequences": 2}


@pytest.mark.parametrize(("model_type", "extra"), CONFIGURATIONS, ids=CONFIGURATION_IDS)
def test_fp16_beam_search_is_dynamic_caches(model_type, extra):
    """Beam search reorders every layer's rows (`reorder_cache`): FP16 through the cache returns the beams
    `DynamicCache` returns, token for token; PN-Mix runs it to the end."""
    expected, _, got, _ = _run(model_type, extra, "FP16", **BEAMS)
    assert got.shape[0] == BEAMS["num_return_sequences"] and torch.equal(got, expected)
    _, _, got, cache = _run(model_type, extra, "PN-Mix", **BEAMS)
    assert got.shape == expected.shape and cache.get_seq_length() == expected.shape[1] - 1


def test_beam_search_runs_on_the_triton_cache():
    model = small_model("llama").to(torch.float16)
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), backend="triton")
    got = generate(model, ids, cache, **BEAMS)
    assert got.shape[0] == BEAMS["num_return_sequences"] and cache.layers[0].cache.layout.n_quantized > 0
    assert cache.layers[0].keys.shape[0] == BEAMS["num_beams"]


def _batch_forward(model, cache, ids):
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        model(input_ids=ids[:, :3], past_key_values=cache, use_cache=True)


SELECTION_CASES = [(m, "reference", None) for m in ("PN-Mix", "KIVI-2", "Kitty", "FP16")] + [
    ("PN-Mix", "triton", None),
    ("PN-Mix", "triton", 64),  # preallocated: the selection keeps the capacity, a later flush overwrites held rows
]


@pytest.mark.parametrize(
    ("method", "backend", "capacity"), SELECTION_CASES, ids=[f"{m}-{b}-{c or 'dynamic'}" for m, b, c in SELECTION_CASES]
)
def test_selected_rows_hold_what_those_rows_hold_alone(method, backend, capacity):
    model = small_model("llama")
    model.set_attn_implementation("pnmix")
    dtype = torch.float16 if backend == "triton" else torch.float32  # what each backend's caches take
    model = model.to(dtype)
    config = _config(model, method)
    ids = torch.randint(3, 128, (3, 21), generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([2, 0, 2, 1])
    selected, alone = (hf.PNMixHFCache(model.config, config, backend=backend, max_cache_len=capacity) for _ in range(2))
    _batch_forward(model, selected, ids)
    before = selected.checkpoint()  # open across the selection and a flush after it: still returns to 3 rows
    selected.select_rows(rows)
    _batch_forward(model, alone, ids[rows])
    for i, (mine, theirs) in enumerate(zip(selected.layers, alone.layers, strict=True)):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values), f"layer {i}"
    q = torch.randn(4, 4, 1, 16, dtype=dtype)
    torch.testing.assert_close(selected.layers[1].cache.attend(q), alone.layers[1].cache.attend(q), rtol=0, atol=0)
    step = torch.randint(3, 128, (4, 9), generator=torch.Generator().manual_seed(3))  # 21 + 3 + 9: a page flushes
    for cache in (selected, alone):
        with torch.no_grad():
            model(input_ids=step, past_key_values=cache, use_cache=True)
    for i, (mine, theirs) in enumerate(zip(selected.layers, alone.layers, strict=True)):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values), f"layer {i} after"
    selected.roll_back(before)
    assert selected.layers[1].keys.shape[0] == 3 and selected.get_seq_length() == 24


def _held(cache) -> list:
    return [(layer.keys.clone(), layer.values.clone(), layer.get_seq_length()) for layer in cache.layers]


def _same(a: list, b: list) -> bool:
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b, strict=True))


class _WithoutSelection:
    """The spec's cache without the optional select_rows (as a plug-in's caches may be)."""

    def __init__(self, cache) -> None:
        self._cache = cache

    def __getattr__(self, name: str):
        if name == "select_rows":
            raise AttributeError(name)
        return getattr(self._cache, name)


class _SpecWithoutSelection(ReferenceImplementation):
    name = "spec-without-select-rows"

    def create(self, config):
        return _WithoutSelection(super().create(config))


def test_a_refused_or_failed_selection_leaves_every_layer_as_it_was(monkeypatch):
    model = small_model("llama")
    model.set_attn_implementation("pnmix")
    ids = torch.randint(3, 128, (2, 21), generator=torch.Generator().manual_seed(2))
    # an implementation whose caches cannot select rows: refused, naming what is missing, before any layer changes
    lacking = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), impl=_SpecWithoutSelection())
    _batch_forward(model, lacking, ids)
    before = _held(lacking)
    with pytest.raises(hf.UnsupportedOperation, match="have no select_rows"):
        lacking.reorder_cache(torch.tensor([1, 0]))
    assert _same(before, _held(lacking))
    # rows out of range, and a failure in the last layer after the first has selected: every layer as it was
    cache = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), backend="reference")
    _batch_forward(model, cache, ids)
    before = _held(cache)
    with pytest.raises(ValueError, match=r"rows 0\.\.1"):
        cache.reorder_cache(torch.tensor([0, 2]))
    monkeypatch.setattr(cache.layers[-1].cache, "select_rows", lambda index: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(MemoryError):
        cache.reorder_cache(torch.tensor([1, 1]))
    assert _same(before, _held(cache))


@pytest.mark.slow  # torch.compile traces each step (about 6 s a method on two CPU cores)
@pytest.mark.parametrize("method", ["FP16", "PN-Mix"])
def test_a_compiled_decode_step_has_no_graph_break_and_decodes_as_eager(method):
    """fullgraph=True refuses any graph break: the cache's value checks, which read inputs back, are deferred while
    torch.compile traces (`reference.ReferenceCache.check`), and read by `PNMixHFCache.check()`."""
    model = small_model("llama")
    model.set_attn_implementation("pnmix")
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(0))
    tokens = []
    for compiled in (False, True):
        cache = hf.PNMixHFCache(model.config, _config(model, method), backend="reference")

        def step(token, cache=cache):
            return model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]

        torch._dynamo.reset()
        run = torch.compile(step, fullgraph=True, backend="eager") if compiled else step
        with torch.no_grad():
            token = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            made = []
            for _ in range(4):  # none flushes a page (PN-Mix: pages of 8, 4 sinks, the prompt's 16 others flushed)
                token = run(token).argmax(-1, keepdim=True)
                made.append(token.item())
        cache.check()
        tokens.append(made)
    assert tokens[0] == tokens[1]


# -- crop: assisted and prompt-lookup decoding ---------------------------------------------------

SPECULATION = {
    "assisted": lambda model: {"assistant_model": _assistant(model)},
    "prompt-lookup": lambda model: {"prompt_lookup_num_tokens": 4},
}


def _assistant(model):
    """A draft model that disagrees with `model` often: the same shape, other weights."""
    torch.manual_seed(7)
    return type(model)(copy.deepcopy(model.config)).eval()  # its own config: it keeps its own attention


def _speculative(model_type: str, extra: dict, method: str, how: str, croppable: bool = True):
    model = small_model(model_type, **extra)
    # a prompt that repeats itself, so that prompt lookup finds candidates (and the model rejects some)
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(3)).repeat(1, 3)
    kwargs = SPECULATION[how](model)
    expected = generate(model, ids, DynamicCache(config=model.config), **kwargs)
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, _config(model, method), backend="reference", croppable=croppable)
    crops = []
    crop = cache.crop
    cache.crop = lambda n: (crops.append((cache.get_seq_length(), n)), crop(n))[1]
    got = generate(model, ids, cache, **kwargs)
    return expected, got, cache, crops


@pytest.mark.parametrize("how", sorted(SPECULATION))
@pytest.mark.parametrize(("model_type", "extra"), CONFIGURATIONS, ids=CONFIGURATION_IDS)
def test_fp16_speculative_decoding_is_dynamic_caches(model_type, extra, how):
    """Assisted and prompt-lookup decoding crop the candidates the model rejected: FP16 through the cache returns
    what `DynamicCache` returns, token for token, with crops that dropped tokens; PN-Mix runs it to the end."""
    expected, got, _, crops = _speculative(model_type, extra, "FP16", how)
    assert torch.equal(got, expected)
    assert any(n < length for length, n in crops), f"no crop dropped a token: {crops}"
    expected_shape = expected.shape
    _, got, cache, crops = _speculative(model_type, extra, "PN-Mix", how)
    assert got.shape == expected_shape and any(n < length for length, n in crops)
    assert cache.get_seq_length() == got.shape[1] - 1


def _feed(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=ids, past_key_values=cache, use_cache=True).logits


def _forward(cache, qkv, pads=None) -> list:
    """One forward through every layer of `cache` as the model runs it (update, then its attention), every layer
    given the same queries, keys and values (and a left-padded batch's padding): what a layer holds then depends on
    the cache alone."""
    q, k, v = qkv
    outs = []
    for i, layer in enumerate(cache.layers):
        key, value = cache.update(k, v, i)
        mask = hf.LayerMask(layer.window, pads)
        outs.append(hf.pnmix_attention(None, q, key, value, mask, scaling=q.shape[-1] ** -0.5)[0])
    return outs


def _tokens(config, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    d, heads, kv = hf.head_dim(config), config.num_attention_heads, config.num_key_value_heads
    return (
        torch.randn(1, heads, n, d, generator=g),
        torch.randn(1, kv, n, d, generator=g),
        torch.randn(1, kv, n, d, generator=g),
    )


def _part(qkv, a: int, b: int):
    return tuple(x[:, :, a:b] for x in qkv)


#: The spec's caches of the channel family, and PN-Mix's Triton cache (interpreter on the CPU).
BACKEND_CASES = [(m, "reference") for m in ("PN-Mix", "KIVI-2", "Kitty", "FP16")] + [("PN-Mix", "triton")]


@pytest.mark.parametrize(("method", "backend"), BACKEND_CASES, ids=[f"{m}-{b}" for m, b in BACKEND_CASES])
@pytest.mark.parametrize(("model_type", "extra"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_a_cropped_cache_holds_what_a_cache_that_never_saw_the_dropped_tokens_holds(model_type, extra, method, backend):
    model = small_model(model_type, **extra)
    config = _config(model, method)
    dtype = torch.float16 if backend == "triton" else torch.float32  # what each backend's caches take
    qkv = tuple(x.to(dtype) for x in _tokens(model.config, 40, seed=4))
    # into a decode forward (a page flushes inside it), into the prefill, twice into one forward
    for prompt, fed, crops in ((20, 14, [-9]), (26, 0, [-3]), (20, 9, [-2, -4]), (20, 6, [0])):
        cropped = hf.PNMixHFCache(model.config, config, backend=backend, croppable=True)
        alone = hf.PNMixHFCache(model.config, config, backend=backend)
        _forward(cropped, _part(qkv, 0, prompt))
        if fed:
            _forward(cropped, _part(qkv, prompt, prompt + fed))
        kept = prompt + fed
        for n in crops:
            cropped.crop(n)
            kept += n
            assert cropped.get_seq_length() == kept
        _forward(alone, _part(qkv, 0, min(prompt, kept)))
        if kept > prompt:
            _forward(alone, _part(qkv, prompt, kept))
        for i, (mine, theirs) in enumerate(zip(cropped.layers, alone.layers, strict=True)):
            where = f"layer {i}, {prompt} + {fed} cropped by {crops}"
            assert mine.get_seq_length() == theirs.get_seq_length(), where
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values), where
        # and they decode alike from there
        nxt = _part(qkv, kept, kept + 2)
        for mine, theirs in zip(_forward(cropped, nxt), _forward(alone, nxt), strict=True):
            assert torch.equal(mine, theirs)


def test_crop_past_the_last_forward_or_without_croppable_is_refused_and_changes_nothing():
    model = small_model("llama")
    model.set_attn_implementation("pnmix")
    ids = torch.randint(3, 128, (1, 30), generator=torch.Generator().manual_seed(5))
    plain = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), backend="reference")
    _feed(model, plain, ids[:, :20])
    before = _held(plain)
    with pytest.raises(hf.UnsupportedOperation, match=r"croppable=True"):
        plain.crop(10)
    assert _same(before, _held(plain))
    plain.crop(25)  # past its length: nothing to drop, as DynamicCache
    assert _same(before, _held(plain))
    cache = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), backend="reference", croppable=True)
    _feed(model, cache, ids[:, :20])
    _feed(model, cache, ids[:, 20:25])
    before = _held(cache)
    with pytest.raises(hf.UnsupportedOperation, match=r"last forward only \(tokens 20 to 25\)"):
        cache.crop(19)
    assert _same(before, _held(cache))
    with pytest.raises(TypeError, match="tokens_to_remove must be an int"):
        cache.crop(2.5)
