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

from .config import PNMixConfig, check_head_dim, field_width


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


class TokenLayout(NamedTuple):
    """Where the tokens of a sequence of a given length live."""

    n_sink: int
    n_quantized: int
    n_residual: int


def token_layout(config: PNMixConfig, length: int) -> TokenLayout:
    """Split `length` tokens into sinks, quantized region and residual.

    The first n_sink tokens are sinks; the rest fill the residual, which is flushed to the
    quantized region each time it reaches N = residual_length tokens. The prompt follows the
    same rule as appended tokens, so the layout depends on the length alone, whatever the
    split into prefill and appends. With N = G (the paper's setting) the prompt's full
    groups are quantized and the remainder stays in the residual.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    n_sink = min(length, config.n_sink)
    rest = length - n_sink
    n_quantized = (rest // config.residual_length) * config.residual_length
    return TokenLayout(n_sink, n_quantized, rest - n_quantized)


def allocation(config: PNMixConfig, length: int, capacity: int | None = None) -> TokenLayout:
    """Tokens each region has room for: exactly `token_layout(length)` for a dynamic cache;
    for a cache preallocated to `capacity` tokens (the paper's static protocol), the most each
    region can ever hold: min(capacity, n_sink) sinks, token_layout(capacity).n_quantized
    quantized tokens, and one residual page of N tokens (fewer if the capacity is smaller).
    """
    if capacity is None:
        return token_layout(config, length)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < length:
        raise ValueError(f"capacity must be an int >= length ({length}), got {capacity!r}")
    sinks = min(capacity, config.n_sink)
    residual = min(config.residual_length, capacity - sinks)
    return TokenLayout(sinks, token_layout(config, capacity).n_quantized, residual)


def storage_model(
    config: PNMixConfig,
    batch: int,
    kv_heads: int,
    head_dim: int,
    length: int,
    dtype: torch.dtype = torch.float16,
    capacity: int | None = None,
) -> StorageReport:
    """Analytic persistent bytes of a cache holding `length` tokens (see `token_layout`).

    dtype is the dtype of the exact tokens (sinks, residual, unquantized values). With a
    capacity, the bytes of a cache preallocated to that many tokens (see `allocation`).
    """
    check_head_dim(config, head_dim)
    sinks, n_q, n_res = allocation(config, length, capacity)
    elt = torch.empty((), dtype=dtype).element_size()
    sb = torch.empty((), dtype=config.scale_dtype).element_size()
    d = head_dim
    n_sal_channels = config.n_salient_channels(d)
    groups = n_q // config.group_size
    if config.values_quantized:
        v_groups = d // config.value_group(d)
        value_payload = n_q * d * field_width(config.value_bits) // 8
        value_scale = n_q * v_groups * sb
    else:
        value_payload, value_scale = n_q * d * elt, 0
    per_head = StorageReport(
        key_low=n_q * field_width(config.b_low) // 8 * d,
        key_high=n_q * field_width(config.b_high - config.b_low) // 8 * n_sal_channels,
        key_scale=groups * d * sb,
        key_zero=groups * d * sb,
        sink_key=sinks * d * elt,
        sink_value=sinks * d * elt,
        residual_key=n_res * d * elt,
        residual_value=n_res * d * elt,
        mask=selection_metadata_bytes(config, d, n_q),
        value_payload=value_payload,
        value_scale=value_scale,
        value_zero=value_scale,
    )
    n = batch * kv_heads
    return StorageReport(**{name: n * b for name, b in per_head.as_dict().items()})


def selection_metadata_bytes(config: PNMixConfig, head_dim: int, n_quantized: int) -> int:
    """Bytes per KV head that say which channels have b_high bits: PN-Mix's pair mask, one bit
    per RoPE pair stored once; nothing for uniform keys; Kitty's per-page channel ranks, d
    bytes per page of G tokens (the page-wise index read at decode time)."""
    if config.selection == "prefill-pairs":
        return math.ceil(head_dim // 2 / 8)
    if config.selection == "page-channels":
        return n_quantized // config.group_size * head_dim
    return 0


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
    """Average key/value bits per element over n_sink + n_quantized tokens (residual empty).

    For H3L1, r = 0.5, G = 128, N_s = 32, d = 128: (32768 * 2.25 + 32 * 16) / 32800 = 2.263.
    """
    if n_quantized % config.residual_length:
        raise ValueError(
            f"n_quantized ({n_quantized}) must be a multiple of residual_length "
            f"({config.residual_length}) so that the residual is empty"
        )
    # An exact region at least as long as T_q (the FP16 cache) is counted over 2 T_q tokens.
    length = min(config.n_sink, n_quantized) + n_quantized
    report = storage_model(config, 1, 1, head_dim, length, dtype)
    elements = length * head_dim
    key = report.key_low + report.key_high + report.key_scale + report.key_zero + report.sink_key
    value = report.value_payload + report.value_scale + report.value_zero + report.sink_value
    return BitWidths(8 * key / elements, 8 * report.mask / elements, 8 * value / elements)
