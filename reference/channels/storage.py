"""Exact storage accounting (paper Appendix, Section 5 of PAPER.md).

Two ways to count, which must agree byte for byte:
- `measure`: the bytes of the tensors a cache actually persists, by component;
- `storage_model`: the analytic model from (config, batch, KV heads, head_dim, length).

`bit_widths` applies the paper's convention: the FP16 residual is excluded from cost and
element count; effective key cost = packed payload + scale/zero + FP16 sink keys; the pair
mask is metadata, reported separately; length-dependent terms use T_q = 32768.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch

from reference.channels.config import PNMixConfig
from reference.channels.layout import (
    EXCLUDED,
    KEY,
    KEY_METADATA,
    VALUE,
    CacheLayout,
    TokenLayout,
    allocation,
    token_layout,
)

__all__ = [
    "COMPONENTS",
    "BitWidths",
    "StorageReport",
    "TokenLayout",
    "allocation",
    "bit_widths",
    "measure",
    "storage_model",
    "token_layout",
]


@dataclasses.dataclass(frozen=True)
class StorageReport:
    """Persistent bytes of a cache, by component (all batch entries and KV heads together)."""

    key_low: int = 0
    key_high: int = 0
    key_scale: int = 0
    key_zero: int = 0
    sink_key: int = 0
    sink_value: int = 0
    residual_key: int = 0
    residual_value: int = 0
    mask: int = 0
    value_payload: int = 0
    value_scale: int = 0
    value_zero: int = 0

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


COMPONENTS = tuple(f.name for f in dataclasses.fields(StorageReport))


def storage_model(
    config: PNMixConfig,
    batch: int,
    kv_heads: int,
    head_dim: int,
    length: int,
    dtype: torch.dtype = torch.float16,
    capacity: int | None = None,
) -> StorageReport:
    """Analytic persistent bytes of a cache holding `length` tokens: the sum of the component
    table of `reference.channels.layout.CacheLayout` over the tokens each region holds.

    dtype is the dtype of the exact tokens (sinks, residual, unquantized values). With a
    capacity, the bytes of a cache preallocated to that many tokens (see `allocation`).
    """
    layout = CacheLayout(config, batch, kv_heads, head_dim, dtype, capacity)
    room = layout.allocated(length)
    counts = {}
    for c in layout.components:
        counts[c.name] = math.prod(layout.shape(c, room)) * torch.empty((), dtype=c.dtype).element_size()
    return StorageReport(**counts)


def measure(tensors: Mapping[str, torch.Tensor | Iterable[torch.Tensor]]) -> StorageReport:
    """Bytes of the tensors a cache holds, by component: {component: tensor or tensors}."""
    unknown = set(tensors) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown storage components {sorted(unknown)}; expected a subset of {COMPONENTS}")
    counts = {}
    for name, value in tensors.items():
        items = [value] if isinstance(value, torch.Tensor) else list(value)
        counts[name] = sum(t.numel() * t.element_size() for t in items)
    return StorageReport(**counts)


class BitWidths(NamedTuple):
    """Average bits per element under the paper's convention (residual excluded)."""

    key_effective: float  # payload + scale/zero + FP16 sinks
    key_metadata: float  # the pair mask
    value_effective: float

    @property
    def key_total(self) -> float:
        """The paper's "total average key-cache bit-width": effective cost plus metadata."""
        return self.key_effective + self.key_metadata


def bit_widths(
    config: PNMixConfig, head_dim: int, n_quantized: int = 32768, dtype: torch.dtype = torch.float16
) -> BitWidths:
    """Average key/value bits per element over n_sink + n_quantized tokens (residual empty):
    keys over the sinks and quantized keys, values over the sinks and quantized values (with a
    sliding value residual the newest N values stay exact, excluded like the residual).

    For H3L1, r = 0.5, G = 128, N_s = 32, d = 128: (32768 * 2.25 + 32 * 16) / 32800 = 2.263.
    """
    if n_quantized % config.residual_length:
        raise ValueError(
            f"n_quantized ({n_quantized}) must be a multiple of residual_length "
            f"({config.residual_length}) so that the residual is empty"
        )
    # An exact region at least as long as T_q (the FP16 cache) is counted over 2 T_q tokens.
    length = min(config.n_sink, n_quantized) + n_quantized
    report = storage_model(config, 1, 1, head_dim, length, dtype).as_dict()
    by_kind = {kind: 0 for kind in (KEY, KEY_METADATA, VALUE, EXCLUDED)}
    for c in CacheLayout(config, 1, 1, head_dim, dtype).components:
        by_kind[c.counts_as] += report[c.name]
    tokens = token_layout(config, length)
    keys, values = length * head_dim, (tokens.n_sink + tokens.n_value_quantized) * head_dim
    return BitWidths(8 * by_kind[KEY] / keys, 8 * by_kind[KEY_METADATA] / keys, 8 * by_kind[VALUE] / max(values, 1))
