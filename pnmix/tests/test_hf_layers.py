"""What transformers' tools read from a cache's layers, as `DynamicCache` gives it: each layer's `keys` and
`values` (here what the layer holds, dequantized) and `get_max_length` (a windowed layer's window), on a
global-attention family and on one that alternates sliding-window and global layers."""

import dataclasses

import pytest
import torch
from transformers import DynamicCache

import pnmix.hf as hf
from pnmix.tests.test_hf_families import generate, small_model
from reference.methods import METHODS

FAMILIES = [("llama", {}), ("gemma2", {"sliding_window": 8})]


def _run(model_type: str, extra: dict, method: str):
    model = small_model(model_type, **extra)
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    dynamic = DynamicCache(config=model.config)
    expected = generate(model, ids, dynamic)
    model.set_attn_implementation("pnmix")
    config = dataclasses.replace(METHODS[method](), pair_layout=hf.detect_pair_layout(model.config))
    if method != "FP16":  # small pages, so that 20 + 11 tokens fill some
        config = dataclasses.replace(config, group_size=8, residual_length=8, n_sink=4)
    cache = hf.PNMixHFCache(model.config, config, backend="reference")
    got = generate(model, ids, cache)
    return expected, dynamic, got, cache


@pytest.mark.parametrize(("model_type", "extra"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_fp16_layers_hold_what_dynamic_caches_layers_hold(model_type, extra):
    expected, dynamic, got, cache = _run(model_type, extra, "FP16")
    assert torch.equal(got, expected)
    assert cache.get_max_length() == dynamic.get_max_length()
    assert any(layer.is_sliding for layer in dynamic.layers) == bool(extra)
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
