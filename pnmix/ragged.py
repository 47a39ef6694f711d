"""Sequences at their own lengths through one forward: `RaggedBatch` puts one single-row `pnmix.hf.PNMixHFCache` per
row under one model call, so that the model's weights are read once for all of them (a batch), while each row's
cache sees only its own tokens, at its own positions, and holds what that row run alone holds.

A left-padded batch (`pnmix.rows.RowCaches`) keeps its rows in step: every forward gives every row the same number
of tokens. Scoring many requests does not fit that: each context has its own prompt, its own decode section and its
own continuations, rolled back between them. Here each forward gives row b any number of its own tokens (none for a
row that waits); in the model's input they are the row's last tokens, after filler that no cache and no real token
sees: each row's cache takes its slice of every layer's keys and values, and each row's attention runs over its own
cache for its own queries. Filler positions compute through the model's per-token parts (projections, MLP) and
their outputs are not read.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from pnmix import hf


class _RaggedLayer(CacheLayerMixin):
    """Layer `index` of every row, as the model's attention layer sees one cache layer."""

    is_compileable = False
    ragged = True  # `pnmix.hf.pnmix_attention` hands attention to `attention` below

    def __init__(self, owner: RaggedBatch, index: int) -> None:
        super().__init__()
        self.owner, self.index = owner, index
        self.is_sliding = owner.caches[0].layers[index].is_sliding
        self.entries: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []  # (row, tokens, keys, values) fed
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states, value_states) -> None:  # each row's layer initializes itself
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Each fed row's cache takes that row's last tokens of these keys and values."""
        if key_states.shape[0] != len(self.owner.fed) or not self.owner.fed:
            raise RuntimeError(
                f"RaggedBatch: a forward of {key_states.shape[0]} rows outside RaggedBatch.forward, which gives each "
                "row its tokens and positions: call it instead of the model"
            )
        t = key_states.shape[2]
        self.entries = []
        for a, (row, n) in enumerate(self.owner.fed):
            k, v = self.owner.caches[row].update(
                key_states[a : a + 1, :, t - n :], value_states[a : a + 1, :, t - n :], self.index, *args, **kwargs
            )
            self.entries.append((row, n, k, v))
        key_states = key_states.view_as(key_states)  # a fresh alias carries the layer (`PNMixLayer.update`: why)
        key_states._pnmix_layer = self
        self._values = value_states
        return key_states, value_states

    def attention(self, module, query: torch.Tensor, value: torch.Tensor, attention_mask, scaling, dropout, **kwargs):
        """Each fed row's attention over its own cache, for its own queries: ([rows, T, H, d], None); filler
        positions zeros."""
        if value is not self._values:
            raise ValueError(
                "PN-Mix attention reads the values the cache holds; this model attends with other values "
                "(e.g. differential attention)"
            )
        t = query.shape[2]
        out = query.new_zeros(query.shape[0], t, query.shape[1], query.shape[3])
        for a, (_, n, k, v) in enumerate(self.entries):
            row = hf.pnmix_attention(
                module, query[a : a + 1, :, t - n :], k, v, attention_mask, scaling, dropout, **kwargs
            )
            out[a, t - n :] = row[0][0]
        self.entries = []  # the rows' own layers hold what they need
        return out, None

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.get_seq_length() + query_length, 0

    def get_max_cache_shape(self) -> int:
        return -1

    def get_max_length(self) -> int:
        return -1


class RaggedBatch(Cache):
    """Rows at their own lengths, one single-row `PNMixHFCache` each, through one forward (module doc).

    `forward(model, tokens)` feeds row b `tokens[b]` (none: the row waits) and returns each fed row's logits. Each
    row's cache is used as it would be alone (its checks, capacity, stepwise attention, checkpoints): between
    forwards a row's cache can be checkpointed, rolled back or read directly. A forward that fails rolls every row
    back to where it began. Not for `generate`: transformers' generation keeps its rows in step (give a left-padded
    batch to one `PNMixHFCache` there)."""

    def __init__(self, caches: Sequence[hf.PNMixHFCache]) -> None:
        caches = list(caches)
        if not caches:
            raise ValueError("caches: expected at least one PNMixHFCache, got none")
        for b, cache in enumerate(caches):
            if not isinstance(cache, hf.PNMixHFCache):
                raise TypeError(f"caches[{b}]: expected a PNMixHFCache, got {type(cache).__name__}")
            if rows := next((n for layer in cache.layers if (n := layer._batch()) > 1), None):
                raise ValueError(f"caches[{b}] holds a batch of {rows} rows: each row of a RaggedBatch is one sequence")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("caches: the same PNMixHFCache is given twice (each row needs its own)")
        if len({len(c.layers) for c in caches}) != 1:
            raise ValueError(
                f"caches of {sorted({len(c.layers) for c in caches})} layers: build every row's cache "
                "from one model's config"
            )
        self.caches = caches
        self.fed: list[tuple[int, int]] = []  # (row, tokens) of the forward in progress
        super().__init__(layers=[_RaggedLayer(self, i) for i in range(len(caches[0].layers))])

    def __len__(self) -> int:
        return len(self.layers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The longest row's length (where the model's own positions would start; `forward` gives each row its
        own)."""
        return max(cache.get_seq_length() for cache in self.caches)

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> tuple[int, int]:
        n = query_length if isinstance(query_length, int) else query_length.shape[0]
        return self.get_seq_length() + n, 0

    def forward(self, model, tokens: Sequence[Sequence[int] | None], last_only: bool = False) -> list:
        """Feed row b the token ids `tokens[b]` (None or empty: not this time) in one forward of `model` (its
        attn_implementation "pnmix"), each at the row's next positions. Returns, per row, the float32 logits of its
        tokens ([n, vocab]; [1, vocab] of its last token with last_only) or None for a row not fed."""
        if len(tokens) != len(self.caches):
            raise ValueError(f"tokens: one entry per row expected ({len(self.caches)}), got {len(tokens)}")
        fed = [(b, list(ids)) for b, ids in enumerate(tokens) if ids is not None and len(ids) > 0]
        if not fed:
            raise ValueError("tokens: every row is empty; feed at least one row at least one token")
        vocab = getattr(model.config, "vocab_size", None)
        for b, ids in fed:
            bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i < 0 or (vocab and i >= vocab)]
            if bad:
                raise ValueError(f"tokens[{b}]: token ids must be ints in [0, {vocab}), got {bad[:3]}")
        width = max(len(ids) for _, ids in fed)
        device = model.device
        ids = torch.empty(len(fed), width, dtype=torch.long)
        positions = torch.empty_like(ids)
        for a, (b, row) in enumerate(fed):
            start = self.caches[b].get_seq_length()
            ids[a] = torch.tensor([row[0]] * (width - len(row)) + row)  # filler: the row's first token, unread
            positions[a] = torch.arange(start - (width - len(row)), start + len(row)).clamp(min=start)
        kwargs = {hf.cache_argument(model): self}
        keeps = "logits_to_keep" in _parameters(model)
        if keeps:
            kwargs["logits_to_keep"] = 1 if last_only else width
        self.fed = [(b, len(row)) for b, row in fed]
        # a row whose last layer went through is done in its own eyes: a later row's failure must still undo it
        saved = {b: self.caches[b].checkpoint() for b, _ in fed}
        try:
            logits = model(input_ids=ids.to(device), position_ids=positions.to(device), **kwargs).logits
        except BaseException:
            for b, state in saved.items():
                self.caches[b].roll_back_forward()
                self.caches[b].roll_back(state)
            raise
        finally:
            self.fed = []
            for b, state in saved.items():
                for layer, held in zip(self.caches[b].layers, state, strict=True):
                    layer.release(held)
        out: list = [None] * len(self.caches)
        for a, (b, row) in enumerate(fed):
            out[b] = (logits[a, -1:] if last_only else logits[a, logits.shape[1] - len(row) :]).float()
        return out


def _parameters(model) -> frozenset[str]:
    return frozenset(inspect.signature(model.forward).parameters)


__all__ = ["RaggedBatch"]
