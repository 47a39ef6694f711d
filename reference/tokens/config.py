"""Per-token precision: TriAxialKV's storage (arXiv 2605.17170) and role-aware PN-Mix, as a layout plan.

Each token has a precision class, low or high bits (2 or 4 by default; the class of its role tag,
`reference.tokens.allocation`). Quantization is asymmetric (Eq. 2, `reference.equations.quant`'s numerics) in
groups of G = 32, everything stored counted:

- high tokens: keys and values per token, in groups of G channels;
- low tokens: values per token in groups of G channels; keys per channel over groups of G low
  tokens taken in order of position (the paper's INT2 pages, which its decode reads before the INT4
  pages: attention does not depend on the order of keys once RoPE is applied);
- leftover: the prompt's low tokens past its last whole group of G keep their keys on the high-bit
  per-token path instead of a full-precision residual; their values stay low (per token, values
  need no group of tokens). Every low token appended later joins the leftover the same way, and
  each time the leftover reaches G keys they form a group, quantized from what they stored (no
  exact copy is kept): this project's reading of the rule for decoding, where the paper states it
  for the prefill. What is stored then depends on the prompt and the bits alone, however later
  tokens are split into appends.
- role-aware PN-Mix (`low_keys="pairs"`): the low tokens' key groups spend the same bits as
  PN-Mix does, b + 1 on the salient RoPE pairs chosen once at prefill (Eq. 6, fraction `ratio`)
  and b - 1 on the rest (Eq. 7 at 1 bit): H3(50%)L1 in place of uniform INT2, the same 2 bits.
- the class of every token is stored once per layer (1 byte a token), as key metadata.

There are no sinks and no exact residual. This module decides where every token's bytes live
(`TokenClasses`, `components`) and what they cost (`storage_model`); `reference.tokens.cache`
carries it out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from reference.channels.config import KEY_BITS, PAIR_LAYOUTS, SCALE_DTYPES, PNMixConfig, _check_int
from reference.channels.layout import KEY, KEY_METADATA, VALUE
from reference.channels.selection import UNIFORM

LOW_KEYS = ("channels", "pairs")


@dataclass(frozen=True)
class TokenPrecisionConfig:
    """A per-token precision cache: TriAxialKV's (`low_keys="channels"`, the defaults) or
    role-aware PN-Mix's (`low_keys="pairs"`, see the module doc)."""

    low_bits: int = 2
    high_bits: int = 4
    group_size: int = 32
    scale_dtype: torch.dtype = field(default=torch.float16)
    low_keys: str = "channels"
    ratio: float = 0.5
    pair_layout: str = "split"

    def __post_init__(self) -> None:
        _check_int("low_bits", self.low_bits, KEY_BITS)
        _check_int("high_bits", self.high_bits, KEY_BITS)
        if self.high_bits <= self.low_bits:
            raise ValueError(f"high_bits must be > low_bits, got high_bits={self.high_bits}, low_bits={self.low_bits}")
        _check_int("group_size", self.group_size)
        if self.group_size <= 0 or self.group_size % 8:
            raise ValueError(f"group_size must be a positive multiple of 8, got {self.group_size}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise TypeError(f"scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype}")
        if self.low_keys not in LOW_KEYS:
            raise ValueError(f"low_keys must be one of {LOW_KEYS}, got {self.low_keys!r}")
        if self.low_keys == "pairs" and not 2 <= self.low_bits <= 7:
            raise ValueError(
                f"low_keys='pairs' spends low_bits +- 1 per pair: low_bits must be 2..7, got {self.low_bits}"
            )
        if self.pair_layout not in PAIR_LAYOUTS:
            raise ValueError(f"pair_layout must be one of {PAIR_LAYOUTS}, got {self.pair_layout!r}")
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise TypeError(f"ratio must be a float in [0, 1], got {self.ratio!r}")
        if not (math.isfinite(self.ratio) and 0.0 <= self.ratio <= 1.0):
            raise ValueError(f"ratio must be in [0, 1], got {self.ratio}")

    @property
    def precisions(self) -> tuple[int, int]:
        return self.low_bits, self.high_bits

    @property
    def low_key_config(self) -> PNMixConfig:
        """The low tokens' key groups as a PN-Mix configuration (pages of G tokens, no sinks):
        uniform low bits (KIVI-style, Eq. 2) or PN-Mix's pairs at low +- 1 bits."""
        common = {
            "group_size": self.group_size,
            "residual_length": self.group_size,
            "n_sink": 0,
            "scale_dtype": self.scale_dtype,
            "pair_layout": self.pair_layout,
            "value_bits": 16,
        }
        if self.low_keys == "channels":
            return PNMixConfig(
                b_high=self.low_bits, b_low=self.low_bits, ratio=0.0, selection=UNIFORM.name, one_bit="ends", **common
            )
        return PNMixConfig(b_high=self.low_bits + 1, b_low=self.low_bits - 1, ratio=self.ratio, **common)

    def check_head_dim(self, head_dim: int) -> None:
        """head_dim must hold whole groups of G channels (the per-token groups) and RoPE pairs."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        if head_dim % self.group_size:
            raise ValueError(
                f"head_dim ({head_dim}) must be a multiple of group_size ({self.group_size}): "
                "per-token keys and values are quantized in groups of G channels"
            )
        if head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates channel pairs), got {head_dim}")

    def check_token_bits(self, token_bits: object, n: int, name: str = "token_bits") -> torch.Tensor:
        """[n] ints, each low_bits or high_bits, as a CPU int64 tensor; ValueError naming `name`."""
        if isinstance(token_bits, torch.Tensor):
            if token_bits.is_floating_point() or token_bits.is_complex() or token_bits.dtype == torch.bool:
                raise TypeError(f"{name} must hold integers (bits per token), got {token_bits.dtype}")
            bits = token_bits.detach().to("cpu", torch.int64)
        elif isinstance(token_bits, Sequence) and all(
            isinstance(b, int) and not isinstance(b, bool) for b in token_bits
        ):
            bits = torch.tensor(list(token_bits), dtype=torch.int64)
        else:
            raise TypeError(f"{name} must be a sequence or 1-D tensor of ints, got {type(token_bits).__name__}")
        if bits.shape != (n,):
            raise ValueError(f"{name} must be [{n}] (one precision per new token), got shape {tuple(bits.shape)}")
        bad = sorted(set(bits.tolist()) - set(self.precisions))
        if bad:
            raise ValueError(f"{name} must hold only {self.precisions} (bits per token), got {bad}")
        return bits


class TokenClasses(NamedTuple):
    """Where the tokens of a sequence live, from their classes alone.

    n_grouped: low tokens whose keys are in whole groups of G (the first ones, in position order);
    n_leftover: the low tokens after them (keys on the high-bit per-token path); n_high: high tokens.
    """

    n_grouped: int
    n_leftover: int
    n_high: int

    @property
    def n_low(self) -> int:
        return self.n_grouped + self.n_leftover

    @property
    def length(self) -> int:
        return self.n_low + self.n_high


def token_classes(config: TokenPrecisionConfig, token_bits: torch.Tensor) -> TokenClasses:
    """Counts of each storage class for a sequence whose tokens have these bits, in order."""
    n_low = int((token_bits == config.low_bits).sum())
    grouped = n_low // config.group_size * config.group_size
    return TokenClasses(grouped, n_low - grouped, int(token_bits.numel()) - n_low)


class Part(NamedTuple):
    """One stored tensor [B, H_kv, rows, columns] ([columns] for the class map)."""

    name: str
    rows: int
    columns: int
    dtype: torch.dtype
    counts_as: str


def components(config: TokenPrecisionConfig, head_dim: int, classes: TokenClasses) -> tuple[Part, ...]:
    """Every tensor a layer's cache holds for these token classes (module doc)."""
    d, g, lo, hi, sd = head_dim, config.group_size, config.low_bits, config.high_bits, config.scale_dtype
    low = config.low_key_config
    n_high_channels = low.n_salient_channels(d)
    pairs = config.low_keys == "pairs"
    return (
        Part("low_key_low", classes.n_grouped * low.b_low // 8, d, torch.uint8, KEY),
        Part("low_key_high", classes.n_grouped * (low.b_high - low.b_low) // 8, n_high_channels, torch.uint8, KEY),
        Part("low_key_scale", classes.n_grouped // g, d, sd, KEY),
        Part("low_key_zero", classes.n_grouped // g, d, sd, KEY),
        Part("pair_mask", 1, math.ceil(d // 2 / 8) if pairs else 0, torch.uint8, KEY_METADATA),
        Part("leftover_key", classes.n_leftover, d * hi // 8, torch.uint8, KEY),
        Part("leftover_key_scale", classes.n_leftover, d // g, sd, KEY),
        Part("leftover_key_zero", classes.n_leftover, d // g, sd, KEY),
        Part("high_key", classes.n_high, d * hi // 8, torch.uint8, KEY),
        Part("high_key_scale", classes.n_high, d // g, sd, KEY),
        Part("high_key_zero", classes.n_high, d // g, sd, KEY),
        Part("low_value", classes.n_low, d * lo // 8, torch.uint8, VALUE),
        Part("low_value_scale", classes.n_low, d // g, sd, VALUE),
        Part("low_value_zero", classes.n_low, d // g, sd, VALUE),
        Part("high_value", classes.n_high, d * hi // 8, torch.uint8, VALUE),
        Part("high_value_scale", classes.n_high, d // g, sd, VALUE),
        Part("high_value_zero", classes.n_high, d // g, sd, VALUE),
    )


#: The class map: one byte per token per layer (shared by the batch's sequences and KV heads).
CLASS_MAP = "token_bits"
PARTS = (*(p.name for p in components(TokenPrecisionConfig(), 32, TokenClasses(0, 0, 0))), CLASS_MAP)


def part_shape(part: Part, batch: int, kv_heads: int) -> tuple[int, ...]:
    if part.name == "pair_mask":
        return (batch, kv_heads, part.columns)
    return (batch, kv_heads, part.rows, part.columns)


def storage_model(
    config: TokenPrecisionConfig, batch: int, kv_heads: int, head_dim: int, token_bits: torch.Tensor
) -> dict[str, int]:
    """Bytes of every stored tensor of one layer's cache holding tokens of these bits (by name, `PARTS`)."""
    config.check_head_dim(head_dim)
    bits = config.check_token_bits(token_bits, int(torch.as_tensor(token_bits).numel()))
    out = {}
    for p in components(config, head_dim, token_classes(config, bits)):
        out[p.name] = math.prod(part_shape(p, batch, kv_heads)) * torch.empty((), dtype=p.dtype).element_size()
    out[CLASS_MAP] = int(bits.numel())
    return out


class TokenBits(NamedTuple):
    """Average bits per element of keys and of values, everything stored counted; the class map
    and pair mask (key metadata) separately."""

    key: float
    key_metadata: float
    value: float

    @property
    def average(self) -> float:
        """Key and value bits together, per element of each (the budget TriAxialKV allocates)."""
        return (self.key + self.key_metadata + self.value) / 2


def bits_per_element(
    config: TokenPrecisionConfig, head_dim: int, token_bits: torch.Tensor, kv_heads: int = 1
) -> TokenBits:
    """`storage_model` in bits per key (value) element of one sequence; the class map is spread over
    its `kv_heads` heads."""
    report = storage_model(config, 1, kv_heads, head_dim, token_bits)
    kinds = {p.name: p.counts_as for p in components(config, head_dim, TokenClasses(0, 0, 0))} | {
        CLASS_MAP: KEY_METADATA
    }
    elements = max(int(torch.as_tensor(token_bits).numel()) * head_dim * kv_heads, 1)
    by = {
        kind: 8 * sum(b for n, b in report.items() if kinds[n] == kind) / elements
        for kind in (KEY, KEY_METADATA, VALUE)
    }
    return TokenBits(by[KEY], by[KEY_METADATA], by[VALUE])


def precision_cost(config: TokenPrecisionConfig, bits: int) -> float:
    """Key and value bits per element of one token stored at `bits` (payload and a scale and a zero
    per group of G), the per-token cost the allocator budgets with; the class map is left out."""
    return bits + 2 * torch.finfo(config.scale_dtype).bits / config.group_size


__all__ = [
    "CLASS_MAP",
    "LOW_KEYS",
    "PARTS",
    "Part",
    "TokenBits",
    "TokenClasses",
    "TokenPrecisionConfig",
    "bits_per_element",
    "components",
    "part_shape",
    "precision_cost",
    "storage_model",
    "token_classes",
]
