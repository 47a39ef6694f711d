"""Rows at their own lengths through one forward (`pnmix.ragged.RaggedBatch`): each row computes and holds what it
computes and holds alone, a failing forward leaves every row as it was, and bad input is refused naming it."""

import itertools

import pytest
import torch

import pnmix.hf as hf
from pnmix.ragged import RaggedBatch
from pnmix.tests.test_hf_families import small_model
from pnmix.tests.test_hf_layers import FAMILIES, _config

#: Per row: (prompt, decode section, continuation) lengths; a row with no decode section waits in that forward.
PLAN = [(20, 5, 6), (7, 3, 1), (15, 0, 4), (9, 12, 2)]


def _rows(seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (sum(parts),), generator=g).tolist() for parts in PLAN]


def _pieces(row: list[int], parts: tuple[int, ...]) -> list[list[int]]:
    edges = [0, *torch.tensor(parts).cumsum(0).tolist()]
    return [row[a:b] for a, b in itertools.pairwise(edges)]


def _alone(model, config, pieces: list[list[int]]):
    """(logits of every token, the cache) of one row run by itself, a forward per piece."""
    cache = hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True)
    out = []
    with torch.no_grad():
        for piece in pieces:
            if piece:
                out.append(
                    model(input_ids=torch.tensor([piece]), **{hf.cache_argument(model): cache}).logits[0].float()
                )
    return torch.cat(out), cache


@pytest.fixture(params=FAMILIES, ids=[f for f, _ in FAMILIES])
def model(request):
    model_type, extra = request.param
    model = small_model(model_type, **extra)
    model.set_attn_implementation(hf.ATTENTION)
    return model


@pytest.mark.parametrize("method", ["FP16", "PN-Mix"])
def test_each_row_computes_and_holds_what_it_does_alone(model, method):
    config = _config(model, method)
    rows = [_pieces(r, p) for r, p in zip(_rows(), PLAN, strict=True)]
    batch = RaggedBatch([hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True) for _ in rows])
    got: list[list[torch.Tensor]] = [[] for _ in rows]
    with torch.no_grad():
        for phase in range(3):
            for b, logits in enumerate(batch.forward(model, [r[phase] for r in rows])):
                if logits is not None:
                    got[b].append(logits)
    for b, pieces in enumerate(rows):
        want, alone = _alone(model, config, pieces)
        # float32: only the batched projections' sums differ (about 1e-7 of a logit)
        torch.testing.assert_close(torch.cat(got[b]), want, rtol=1e-5, atol=1e-5)
        assert batch.caches[b].get_seq_length() == alone.get_seq_length() == sum(PLAN[b])
        for mine, theirs in zip(batch.caches[b].layers, alone.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine.values, theirs.values, rtol=1e-5, atol=1e-5)


def test_last_only_gives_each_rows_last_logits_and_rows_roll_back_on_their_own(model):
    config = _config(model, "PN-Mix")
    rows = [_pieces(r, p) for r, p in zip(_rows(seed=5), PLAN, strict=True)]
    batch = RaggedBatch([hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True) for _ in rows])
    with torch.no_grad():
        batch.forward(model, [r[0] for r in rows], last_only=True)
        saved = [cache.checkpoint() for cache in batch.caches]
        first = batch.forward(model, [r[1] for r in rows], last_only=True)
        for cache, state in zip(batch.caches, saved, strict=True):
            cache.roll_back(state)
        again = batch.forward(model, [r[1] for r in rows], last_only=True)
    for b, pieces in enumerate(rows):
        if not pieces[1]:
            assert first[b] is None and again[b] is None
            continue
        want, _ = _alone(model, config, pieces[:2])
        assert first[b].shape == (1, want.shape[-1])
        torch.testing.assert_close(first[b][0], want[-1], rtol=1e-5, atol=1e-5)
        assert torch.equal(again[b], first[b])


def test_a_failing_forward_leaves_every_row_as_it_was(model, monkeypatch):
    config = _config(model, "PN-Mix")
    rows = [_pieces(r, p) for r, p in zip(_rows(seed=7), PLAN, strict=True)]
    batch = RaggedBatch([hf.PNMixHFCache(model.config, config, backend="reference", stepwise=True) for _ in rows])
    with torch.no_grad():
        batch.forward(model, [r[0] for r in rows])
        before = [[layer.keys.clone() for layer in cache.layers] for cache in batch.caches]
        victim = batch.caches[2].layers[-1]  # the last row fed, in the last layer: every other row went through it

        def fail(*args, **kwargs):
            raise RuntimeError("an attention that fails (a test's)")

        monkeypatch.setattr(victim.cache, "attend_stepwise", fail)
        with pytest.raises(RuntimeError, match="a test's"):
            batch.forward(model, [r[2] for r in rows])
    for cache, held, parts in zip(batch.caches, before, PLAN, strict=True):
        assert cache.get_seq_length() == parts[0]
        for layer, keys in zip(cache.layers, held, strict=True):
            assert torch.equal(layer.keys, keys)


def test_bad_rows_and_tokens_are_refused_naming_them(model):
    config = _config(model, "FP16")
    one = hf.PNMixHFCache(model.config, config, backend="reference")
    with pytest.raises(TypeError, match=r"caches\[1\]: expected a PNMixHFCache, got DynamicCache"):
        from transformers import DynamicCache

        RaggedBatch([one, DynamicCache(config=model.config)])
    with pytest.raises(ValueError, match="the same PNMixHFCache is given twice"):
        RaggedBatch([one, one])
    with pytest.raises(ValueError, match="expected at least one"):
        RaggedBatch([])
    two = hf.PNMixHFCache(model.config, config, backend="reference")
    with torch.no_grad():
        model(input_ids=torch.randint(3, 128, (2, 5)), **{hf.cache_argument(model): two})
    with pytest.raises(ValueError, match=r"caches\[0\] holds a batch of 2 rows"):
        RaggedBatch([two])
    batch = RaggedBatch([one, hf.PNMixHFCache(model.config, config, backend="reference")])
    with pytest.raises(ValueError, match=r"tokens: one entry per row expected \(2\), got 1"):
        batch.forward(model, [[5]])
    with pytest.raises(ValueError, match="every row is empty"):
        batch.forward(model, [[], None])
    with pytest.raises(ValueError, match=r"tokens\[1\]: token ids must be ints in \[0, 128\)"):
        batch.forward(model, [[5], [3, 128]])
    with pytest.raises(RuntimeError, match=r"outside RaggedBatch\.forward"), torch.no_grad():
        model(input_ids=torch.tensor([[5], [6]]), **{hf.cache_argument(model): batch})
    assert one.get_seq_length() == 0
