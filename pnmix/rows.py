"""A left-padded batch's caches: one cache per row, each built from its row's own tokens (the padding stripped), so
that padding never enters a row's saliency (Eq. 6), sinks, pages or residual, and each row holds what that row run
alone holds. `pnmix.hf.PNMixLayer` talks to it as to one cache of the whole batch.

Positions count the padding (transformers' cache positions do): `length` is the padded length, the same for every
row; row b holds `length - pads[b]` tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch

from reference.channels.storage import COMPONENTS, StorageReport


class RowCaches:
    """The caches of a left-padded batch, one per row (`pads[b]`: the leading positions of row b that are padding)."""

    def __init__(self, caches: Sequence, pads: Sequence[int]) -> None:
        if len(caches) != len(pads) or not caches:
            raise ValueError(f"one cache per row: {len(caches)} caches for {len(pads)} rows")
        self.caches, self.pads = list(caches), [int(p) for p in pads]

    @classmethod
    def prefill(cls, create: Callable[[], object], pads: Sequence[int], q, k, v, *extra) -> RowCaches:
        """A cache per row from `create()`, prefilled with that row's tokens after its padding ([B, H, T, d] in)."""
        caches = []
        for b, pad in enumerate(pads):
            cache = create()
            cache.prefill(q[b : b + 1, :, pad:], k[b : b + 1, :, pad:], v[b : b + 1, :, pad:], *extra)
            caches.append(cache)
        return cls(caches, pads)

    @property
    def length(self) -> int:
        """Positions held, padding included (the same for every row)."""
        return self.caches[0].length + self.pads[0]

    @property
    def batch(self) -> int:
        return len(self.caches)

    def append(self, k: torch.Tensor, v: torch.Tensor, *extra) -> None:
        for b, cache in enumerate(self.caches):
            cache.append(k[b : b + 1], v[b : b + 1], *extra)

    def attend(self, q: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.cat([cache.attend(q[b : b + 1], **kwargs) for b, cache in enumerate(self.caches)])

    def residual(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each row's exact residual (rows hold different counts)."""
        return [cache.residual() for cache in self.caches]

    def attend_stepwise(self, q: torch.Tensor, tails: Sequence[tuple[torch.Tensor, torch.Tensor]], **kwargs):
        """`attend_stepwise` of each row with its own exact tail (`tails[b]`: keys, values)."""
        return torch.cat(
            [cache.attend_stepwise(q[b : b + 1], *tails[b], **kwargs) for b, cache in enumerate(self.caches)]
        )

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, H_kv, length, d] keys and values, each row's padding as zeros (what it holds starts after it)."""
        held = [cache.dequantize() for cache in self.caches]
        k0 = held[0][0]
        keys = k0.new_zeros(self.batch, k0.shape[1], self.length, k0.shape[3])
        values = torch.zeros_like(keys, dtype=held[0][1].dtype)
        for b, ((k, v), pad) in enumerate(zip(held, self.pads, strict=True)):
            keys[b, :, pad:], values[b, :, pad:] = k[0], v[0]
        return keys, values

    def checkpoint(self) -> list:
        return [cache.checkpoint() for cache in self.caches]

    def roll_back(self, saved: list) -> None:
        for cache, state in zip(self.caches, saved, strict=True):
            cache.roll_back(state)

    def release(self, saved: list) -> None:
        for cache, state in zip(self.caches, saved, strict=True):
            cache.release(state)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the rows `index`, in that order; a row kept twice becomes two caches (each then grows its own way)."""
        rows = [int(i) for i in index.tolist()]
        if any(not 0 <= i < self.batch for i in rows):
            raise IndexError(f"index must hold rows in [0, {self.batch}), got {rows}")
        seen: set[int] = set()
        caches = []
        for i in rows:
            caches.append(self.caches[i] if i not in seen else copy.deepcopy(self.caches[i]))
            seen.add(i)
        self.caches, self.pads = caches, [self.pads[i] for i in rows]

    def check(self) -> None:
        for b, cache in enumerate(self.caches):
            check = getattr(cache, "check", None)
            if callable(check):
                try:
                    check()
                except ValueError as error:
                    raise ValueError(f"row {b}: {error}") from None

    def storage(self) -> StorageReport:
        """Every row's bytes, by component."""
        reports = [cache.storage().as_dict() for cache in self.caches]
        return StorageReport(**{name: sum(r[name] for r in reports) for name in COMPONENTS})


__all__ = ["RowCaches"]
