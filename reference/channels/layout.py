"""The cache-layout plan: where every token lives and what every stored tensor looks like.

This module is the one place that decides
- which tokens are sinks, quantized or residual (`token_layout`, paper Fig. 1 and Section 5),
- how much room each region has in a preallocated cache (`allocation`),
- which new tokens of an append go where and which pages flush (`CacheLayout.plan`),
- the table of stored components: shape, dtype and how each counts in the storage report
  (`CacheLayout.components`).

Caches (`reference.ReferenceCache`, `pnmix.PNMixCache`) allocate from the table and carry
out plans; kernels read a region described by the table; `reference.storage_model` sums it.
Nothing else re-derives any of this (plan/run, as FlashInfer splits its decode wrappers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import torch

from reference.channels.config import PNMixConfig, check_head_dim


class TokenLayout(NamedTuple):
    """Where the tokens of a sequence of a given length live.

    Keys: n_sink sinks, n_quantized quantized, n_residual exact newest. Values: the same sinks,
    n_value_quantized quantized, n_value_residual exact newest; with the "shared" value
    residual (`PNMixConfig.value_residual`) these equal the keys' counts.
    """

    n_sink: int
    n_quantized: int
    n_residual: int
    n_value_quantized: int
    n_value_residual: int

    @property
    def length(self) -> int:
        return self.n_sink + self.n_quantized + self.n_residual


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def token_layout(config: PNMixConfig, length: int) -> TokenLayout:
    """Split `length` tokens into sinks, quantized region and residual, for keys and for values.

    The first n_sink tokens are sinks; the rest fill the residual, which is flushed to the
    quantized region each time it reaches N = residual_length tokens. The prompt follows the
    same rule as appended tokens, so the layout depends on the length alone, whatever the
    split into prefill and appends. With N = G (the paper's setting) the prompt's full
    groups are quantized and the remainder stays in the residual. Values follow the keys
    (value_residual "shared"), or keep the N newest exact ("sliding", the published KIVI).
    """
    _check_count("length", length)
    n_sink = min(length, config.n_sink)
    rest = length - n_sink
    n_quantized = (rest // config.residual_length) * config.residual_length
    n_value_residual = rest - n_quantized if config.value_residual == "shared" else min(rest, config.residual_length)
    return TokenLayout(n_sink, n_quantized, rest - n_quantized, rest - n_value_residual, n_value_residual)


def exact_tail(config: PNMixConfig, calls: int | Sequence[int], policy: str = "shared") -> tuple[int, int]:
    """How many of the newest tokens (beyond the sinks) keep exact keys and exact values under a
    residual policy of `reference.contract.RESIDUAL_POLICIES`, after calls that brought these
    token counts (the prompt, then each append; an int is the length, enough for the policies
    that depend on it alone).

    shared (this spec): both are the residual of `token_layout`. sliding_values (the published
    KIVI): keys the same; values the residual_length newest, all of them while there are fewer.
    requantize (transformers' QuantizedCache): the prompt is quantized whole; appended tokens stay
    exact until an append would bring them to residual_length, when everything is quantized again.
    """
    sizes = [calls] if isinstance(calls, int) else list(calls)
    if not sizes:
        raise ValueError("calls must hold the prompt's token count at least")
    for n in sizes:
        _check_count("calls", n)
    if policy in ("shared", "sliding_values"):
        value_residual = "shared" if policy == "shared" else "sliding"
        layout = token_layout(dataclasses.replace(config, value_residual=value_residual), sum(sizes))
        return layout.n_residual, layout.n_value_residual
    if policy == "requantize":
        if isinstance(calls, int):
            raise ValueError("the requantize policy depends on the calls, not the length alone: pass their sizes")
        exact = 0
        for n in sizes[1:]:
            exact = 0 if exact + n >= config.residual_length else exact + n
        return exact, exact
    raise ValueError(f"policy must be 'shared', 'sliding_values' or 'requantize', got {policy!r}")


def allocation(config: PNMixConfig, length: int, capacity: int | None = None) -> TokenLayout:
    """Tokens each region has room for: exactly `token_layout(length)` for a dynamic cache;
    for a cache preallocated to `capacity` tokens (the paper's static protocol), the most each
    region can ever hold: min(capacity, n_sink) sinks, token_layout(capacity)'s quantized keys
    and values, and one residual page of N tokens (fewer if the capacity is smaller).
    """
    if capacity is None:
        return token_layout(config, length)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < length:
        raise ValueError(f"capacity must be an int >= length ({length}), got {capacity!r}")
    sinks = min(capacity, config.n_sink)
    residual = min(config.residual_length, capacity - sinks)
    full = token_layout(config, capacity)
    return TokenLayout(sinks, full.n_quantized, residual, full.n_value_quantized, residual)


#: How a component counts under the paper's bit-width convention (`reference.channels.storage.bit_widths`).
KEY, KEY_METADATA, VALUE, EXCLUDED = "key", "key-metadata", "value", "excluded"


class Component(NamedTuple):
    """One stored tensor of a layer's cache, [B, H_kv, rows, columns] (or [B, H_kv, columns]).

    region: "sink" or "residual" (rows are tokens), "quantized" (`rows_per_page` rows for
    each page of N quantized tokens), or "sequence" (stored once, no row axis). stream: whose
    tokens the region counts, "keys" or "values" (they differ with a sliding value residual).
    counts_as: KEY, KEY_METADATA, VALUE or EXCLUDED (the FP16 residual).
    """

    name: str
    region: str
    rows_per_page: int
    columns: int
    dtype: torch.dtype
    counts_as: str
    stream: str = "keys"

    def rows(self, tokens: TokenLayout, residual_length: int) -> int | None:
        """Rows holding `tokens` (None for a component without a row axis)."""
        values = self.stream == "values"
        if self.region == "sink":
            return tokens.n_sink
        if self.region == "residual":
            return tokens.n_value_residual if values else tokens.n_residual
        if self.region == "quantized":
            # Whole pages for keys; values may be quantized a token at a time (one row each).
            return (tokens.n_value_quantized if values else tokens.n_quantized) * self.rows_per_page // residual_length
        return None


class AppendPlan(NamedTuple):
    """What one append of n_new tokens to a cache holding `before` does.

    The first `to_sink` new tokens go to the sinks; then the residual and the remaining new
    tokens, in order, form a queue whose first `flush` tokens (whole pages of N) are
    quantized and appended to the quantized region; the rest is the new residual. Values
    form their own queue (their residual, then the new tokens), whose first `value_flush`
    are quantized: `flush` of them with a shared residual, any number with a sliding one.
    """

    before: TokenLayout
    after: TokenLayout
    to_sink: int
    flush: int

    @property
    def n_new(self) -> int:
        return self.after.length - self.before.length

    @property
    def to_residual(self) -> int:
        """New tokens that enter the residual queue (some may flush at once)."""
        return self.n_new - self.to_sink

    @property
    def value_flush(self) -> int:
        return self.after.n_value_quantized - self.before.n_value_quantized

    def pages(self, residual_length: int) -> int:
        return self.flush // residual_length

    def sink_positions(self) -> range:
        return range(self.before.length, self.before.length + self.to_sink)

    def flushed_positions(self) -> range:
        """Absolute token positions quantized by this append."""
        start = self.after.n_sink + self.before.n_quantized
        return range(start, start + self.flush)


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """The storage plan of one layer's cache: batch B, H_kv KV heads, head_dim d, exact dtype.

    capacity: None for a cache that grows exactly; an int for one preallocated to that many
    tokens (the paper's static protocol), which then refuses to grow past it.
    """

    config: PNMixConfig
    batch: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float16
    capacity: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, PNMixConfig):
            raise TypeError(f"config must be a PNMixConfig, got {type(self.config).__name__}")
        for name in ("batch", "kv_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_head_dim(self.config, self.head_dim)
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {self.dtype!r}")
        if self.capacity is not None and (
            isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1
        ):
            raise ValueError(f"capacity (max_cache_len) must be a positive int or None, got {self.capacity!r}")

    # -- the table --------------------------------------------------------------------

    @property
    def selection(self):
        """The channel-selection rule (`reference.channels.selection`)."""
        return self.config.selector

    @property
    def n_high_channels(self) -> int:
        """Columns of the key high plane: channels with b_high bits (per group, if per_group)."""
        return self.config.n_salient_channels(self.head_dim)

    @property
    def components(self) -> tuple[Component, ...]:
        """Every tensor a cache of this layout stores; `reference.channels.storage.StorageReport` has one
        field per component name."""
        cfg, d, n = self.config, self.head_dim, self.config.residual_length
        sd, exact = cfg.scale_dtype, self.dtype
        groups = n // cfg.group_size  # key groups per page
        if cfg.values_quantized:
            v_cols, v_dtype, v_groups = d * cfg.value_bits // 8, torch.uint8, d // cfg.value_group(d)
        else:
            v_cols, v_dtype, v_groups = d, exact, 0
        sel = self.selection
        mask = (
            Component("mask", "quantized", groups, sel.metadata_columns(d), torch.uint8, KEY_METADATA)
            if sel.per_group
            else Component("mask", "sequence", 0, sel.metadata_columns(d), torch.uint8, KEY_METADATA)
        )
        return (
            Component("key_low", "quantized", n * cfg.b_low // 8, d, torch.uint8, KEY),
            Component(
                "key_high",
                "quantized",
                n * (cfg.b_high - cfg.b_low) // 8,
                self.n_high_channels,
                torch.uint8,
                KEY,
            ),
            Component("key_scale", "quantized", groups, d, sd, KEY),
            Component("key_zero", "quantized", groups, d, sd, KEY),
            Component("sink_key", "sink", 1, d, exact, KEY),
            Component("sink_value", "sink", 1, d, exact, VALUE, "values"),
            Component("residual_key", "residual", 1, d, exact, EXCLUDED),
            Component("residual_value", "residual", 1, d, exact, EXCLUDED, "values"),
            mask,
            Component("value_payload", "quantized", n, v_cols, v_dtype, VALUE, "values"),
            Component("value_scale", "quantized", n, v_groups, sd, VALUE, "values"),
            Component("value_zero", "quantized", n, v_groups, sd, VALUE, "values"),
        )

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(f"no stored component {name!r}; expected one of {[c.name for c in self.components]}")

    def shape(self, component: Component, tokens: TokenLayout) -> tuple[int, ...]:
        """Shape of `component` holding `tokens`."""
        rows = component.rows(tokens, self.config.residual_length)
        lead = (self.batch, self.kv_heads)
        return (*lead, component.columns) if rows is None else (*lead, rows, component.columns)

    # -- tokens -----------------------------------------------------------------------

    def tokens(self, length: int) -> TokenLayout:
        """Where `length` tokens live (`token_layout`)."""
        return token_layout(self.config, length)

    def allocated(self, length: int = 0) -> TokenLayout:
        """Tokens each region has room for while holding `length` (`allocation`)."""
        return allocation(self.config, length, self.capacity)

    def allocate(self, device: torch.device | str, length: int = 0) -> dict[str, torch.Tensor]:
        """Uninitialized tensors of every component with room for `allocated(length)`."""
        room = self.allocated(length)
        return {c.name: torch.empty(self.shape(c, room), dtype=c.dtype, device=device) for c in self.components}

    def check_capacity(self, length: int, name: str = "k") -> None:
        """ValueError naming `name` if holding `length` tokens would pass the capacity."""
        if self.capacity is not None and length > self.capacity:
            raise ValueError(
                f"{name} would make the cache hold {length} tokens, past its capacity max_cache_len={self.capacity}"
            )

    def plan(self, length: int, n_new: int) -> AppendPlan:
        """Where n_new tokens appended to a cache holding `length` tokens go (see `AppendPlan`).

        Raises ValueError if the cache would pass its capacity; a cache must ask for the
        plan before it changes anything, so that a refused append leaves it as it was.
        """
        _check_count("length", length)
        _check_count("n_new", n_new)
        self.check_capacity(length + n_new)
        before, after = self.tokens(length), self.tokens(length + n_new)
        return AppendPlan(before, after, after.n_sink - before.n_sink, after.n_quantized - before.n_quantized)
