"""Implementations that are correct in unusual ways (selectable with --impl): the suite must pass
them, or skip what none of its cases can reach. Each is the reference with one unusual but sound
trait, so a property that fails one judges something other than conformance
(conformance/meta/test_sound.py)."""

from __future__ import annotations

import dataclasses

from reference import PNMixConfig, ReferenceCache
from reference.contract import Capabilities, variant
from reference.contract.implementation import ReferenceImplementation


class _ReadsMetadataLate(ReferenceCache):
    """Reads its inputs' shape, device and dtype after every write, as a wrapper logging its calls
    would: reading metadata cannot fail, so doing it late leaves the all-or-nothing rule intact."""

    def prefill(self, q, k, v):
        super().prefill(q, k, v)
        self._last = (tuple(k.shape), k.device, k.dtype, k.size(-1), k.dim(), q.shape[1])

    def append(self, k, v):
        super().append(k, v)
        self._last = (tuple(k.shape), k.device, k.dtype, k.size(-1), k.dim(), v.shape[-2])


def late_metadata() -> ReferenceImplementation:
    impl = variant(ReferenceImplementation(), "late_metadata", ReferenceImplementation.capabilities)
    impl.cache_class = _ReadsMetadataLate
    return impl


def _values_by_key_group(config: PNMixConfig) -> PNMixConfig:
    """Values quantized in groups of G channels, G the key group size (KIVI's own code does so)."""
    return dataclasses.replace(config, value_group_size=config.group_size)


def small_head_dims() -> ReferenceImplementation:
    """Claims head_dims (16, 32) with value groups of G channels: a case at G = 128 (the paper's)
    fits no claimed head_dim, while the cases at smaller groups do."""
    caps = dataclasses.replace(Capabilities(), head_dims=(16, 32), preset=_values_by_key_group)
    return variant(ReferenceImplementation(), "small_head_dims", caps)


def nothing_fits() -> ReferenceImplementation:
    """Claims appends in multiples of 64 tokens but at most 32 tokens: no case fits its claims, so
    every property of the family is skipped (not passed), having run no example."""
    caps = dataclasses.replace(Capabilities(), token_multiple=64, max_tokens=32)
    return variant(ReferenceImplementation(), "nothing_fits", caps)
