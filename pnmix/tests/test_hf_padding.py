"""Left-padded batches (`pnmix.rows.RowCaches`): padding never enters a row's cache, each row holds what that row
alone holds, and FP16 through the cache generates what `DynamicCache` generates for the same padded batch."""

import pytest
import torch
from transformers import DynamicCache

import pnmix.hf as hf
from pnmix.tests.test_hf_families import small_model
from pnmix.tests.test_hf_layers import (
    BACKEND_CASES,
    CONFIGURATION_IDS,
    CONFIGURATIONS,
    FAMILIES,
    _config,
    _forward,
    _tokens,
)

LENGTHS = (30, 21, 12)  # the longest row unpadded, the others padded on the left


def _padded(lengths, extra: int = 0, seed: int = 1):
    """Left-padded input ids and mask of rows of `lengths` tokens (and `extra` more padding on every row)."""
    total = max(lengths) + extra
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, total - n :] = torch.randint(3, 128, (n,), generator=g)
        mask[b, total - n :] = 1
    return ids, mask


def _generate(model, ids, mask, cache):
    kwargs = {hf.cache_argument(model): cache}
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False, **kwargs
    )


@pytest.mark.parametrize("extra", [0, 3], ids=["padded", "extra-padding"])
@pytest.mark.parametrize(("model_type", "extra_config"), CONFIGURATIONS, ids=CONFIGURATION_IDS)
def test_fp16_generates_what_dynamic_cache_generates_for_a_padded_batch(model_type, extra_config, extra):
    model = small_model(model_type, **extra_config)
    ids, mask = _padded(LENGTHS, extra)
    expected = _generate(model, ids, mask, DynamicCache(config=model.config))
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, _config(model, "FP16"), backend="reference")
    got = _generate(model, ids, mask, cache)
    assert torch.equal(got, expected)
    cache = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), backend="reference")
    got_pnmix = _generate(model, ids, mask, cache)
    assert got_pnmix.shape == expected.shape


@pytest.mark.parametrize(("method", "backend"), BACKEND_CASES, ids=[f"{m}-{b}" for m, b in BACKEND_CASES])
@pytest.mark.parametrize(("model_type", "extra_config"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_each_row_holds_what_that_row_alone_holds_and_padding_enters_nothing(model_type, extra_config, method, backend):
    model = small_model(model_type, **extra_config)
    config = _config(model, method)
    dtype = torch.float16 if backend == "triton" else torch.float32
    total, decode = max(LENGTHS) + 2, 6
    rows = [tuple(x.to(dtype) for x in _tokens(model.config, n + decode, seed=b)) for b, n in enumerate(LENGTHS)]
    pads = tuple(total - n for n in LENGTHS)
    # the padded prompt: padding as huge values, which would show in any scale, sink or saliency they entered
    prompt = []
    for part in range(3):
        x = torch.full((len(LENGTHS), rows[0][part].shape[1], total, rows[0][part].shape[3]), 1e4, dtype=dtype)
        for b, n in enumerate(LENGTHS):
            x[b, :, pads[b] :] = rows[b][part][0, :, :n]
        prompt.append(x)
    batch = hf.PNMixHFCache(model.config, config, backend=backend)
    _forward(batch, prompt, pads)
    outs = [
        _forward(
            batch,
            [torch.cat([r[p][:, :, n + s : n + s + 1] for r, n in zip(rows, LENGTHS, strict=True)]) for p in range(3)],
        )
        for s in range(decode)
    ]
    for b, n in enumerate(LENGTHS):
        alone = hf.PNMixHFCache(model.config, config, backend=backend)
        _forward(alone, [t[:, :, :n] for t in rows[b]])
        mine = [_forward(alone, [t[:, :, n + s : n + s + 1] for t in rows[b]]) for s in range(decode)]
        for i, (layer, theirs) in enumerate(zip(batch.layers, alone.layers, strict=True)):
            where = f"row {b}, layer {i}"
            if layer.window is None:
                assert torch.equal(layer.keys[b : b + 1, :, pads[b] :], theirs.keys), where
                assert torch.equal(layer.values[b : b + 1, :, pads[b] :], theirs.values), where
            for s in range(decode):  # every decode step's attention, row b of the batch against the row alone
                torch.testing.assert_close(outs[s][i][b : b + 1], mine[s][i], msg=f"{where}, step {s}")
    assert batch.get_seq_length() == total + decode


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), "left padding only"),
        (torch.tensor([[0, 1, 0, 1], [1, 1, 1, 1]]), "left padding only"),
        (torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]), "all padding"),
    ],
    ids=["right", "holes", "empty-row"],
)
def test_padding_a_row_cache_cannot_hold_is_refused(mask, message):
    model = small_model("llama")
    model.set_attn_implementation("pnmix")
    cache = hf.PNMixHFCache(model.config, _config(model, "PN-Mix"), backend="reference")
    ids = torch.randint(3, 128, mask.shape)
    with pytest.raises(ValueError, match=message):
        model(input_ids=ids, attention_mask=mask, **{hf.cache_argument(model): cache})
    assert cache.get_seq_length() == 0
