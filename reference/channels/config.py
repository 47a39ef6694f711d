"""PN-Mix configuration (paper Section 5 and Table 14), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from reference.channels.selection import SELECTIONS
from reference.equations.packing import block_positions
from reference.equations.saliency import CRITERIA

#: Key code widths of the paper's sweep (Table 14) plus 8 bits; value widths add 16 = unquantized.
KEY_BITS = tuple(range(1, 9))  # any width: a b-bit code is stored in exactly b bits (bit_planes)
VALUE_BITS = (*KEY_BITS, 16)
PAIR_LAYOUTS = ("adjacent", "split")
#: 1-bit groups: Eq. 7 bin midpoints (PN-Mix) or Eq. 2 group ends (KIVI's 1-bit keys).
ONE_BIT = ("midpoint", "ends")
#: Which newest values stay exact: the keys' residual (this spec) or a sliding window of the
#: residual_length newest values, one value quantized per token past it (the published KIVI).
VALUE_RESIDUALS = ("shared", "sliding")
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_int(name: str, value: object, allowed: tuple[int, ...] | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if allowed is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value}")


@dataclass(frozen=True)
class PNMixConfig:
    """Every knob of a PN-Mix key/value cache; defaults are the paper's main configuration.

    b_high / b_low: key bits of salient / other channels (paper: 3 / 1).
    ratio: fraction r of RoPE pairs that are salient; floor(r * d / 2) pairs per KV head.
    group_size: G, tokens per key quantization group (one scale/zero per channel per G tokens).
    residual_length: N, FP16 residual tokens; flushed to the quantized region when it reaches N.
    n_sink: N_s, first tokens kept exactly (keys and values).
    value_bits: b_V; 16 keeps values unquantized.
    value_group_size: channels per value group (per token); None means the whole head_dim.
    pair_layout: "adjacent" pairs channels (2i, 2i+1) as the paper writes; "split" pairs
        (i, i + d/2) as Hugging Face `rotate_half` models (Llama, Qwen, SmolLM2) do. The
        default is "split" because that is what the models users load actually store.
    scale_dtype: storage dtype of every scale and zero.
    selection: the name of a rule of `reference.channels.selection` (which key channels get b_high
        bits): PN-Mix's pairs chosen once at prefill (Eq. 6, the default), none (uniform
        keys, KIVI; needs b_high == b_low) or Kitty's channels chosen per page of G keys.
    one_bit: "midpoint" (Eq. 7) or "ends" (Eq. 2 with b = 1) for 1-bit groups.
    criterion: what the prefill pair selection ranks pairs by: "qk-pair-norm" (Eq. 6, PN-Mix) or the
        ablations' "k-pair-norm", "k-magnitude", "k-range" (reference.equations.saliency.criterion_scores).
    value_residual: "shared": values stay exact with their keys and are flushed with them, N at
        a time (PN-Mix); "sliding": the N newest values stay exact and each token past them
        quantizes the oldest value at once (the published KIVI; keys are still flushed N at a time).
    """

    b_high: int = 3
    b_low: int = 1
    ratio: float = 0.5
    group_size: int = 128
    residual_length: int = 128
    n_sink: int = 32
    value_bits: int = 2
    value_group_size: int | None = None
    pair_layout: str = "split"
    scale_dtype: torch.dtype = field(default=torch.float16)
    selection: str = "prefill-pairs"  # reference.channels.selection.PrefillPairs
    one_bit: str = "midpoint"
    criterion: str = "qk-pair-norm"
    value_residual: str = "shared"

    def __post_init__(self) -> None:
        _check_int("b_high", self.b_high, KEY_BITS)
        _check_int("b_low", self.b_low, KEY_BITS)
        if self.b_high < self.b_low:
            raise ValueError(f"b_high must be >= b_low, got b_high={self.b_high}, b_low={self.b_low}")
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise TypeError(f"ratio must be a float in [0, 1], got {self.ratio!r}")
        if not (math.isfinite(self.ratio) and 0.0 <= self.ratio <= 1.0):
            raise ValueError(f"ratio must be in [0, 1], got {self.ratio}")
        _check_int("group_size", self.group_size)
        if self.group_size <= 0 or self.group_size % 8:
            raise ValueError(f"group_size must be a positive multiple of 8, got {self.group_size}")
        _check_int("residual_length", self.residual_length)
        if self.residual_length <= 0 or self.residual_length % self.group_size:
            raise ValueError(
                "residual_length must be a positive multiple of group_size "
                f"({self.group_size}), got {self.residual_length}"
            )
        if self.value_residual not in VALUE_RESIDUALS:
            raise ValueError(f"value_residual must be one of {VALUE_RESIDUALS}, got {self.value_residual!r}")
        _check_int("n_sink", self.n_sink)
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be >= 0, got {self.n_sink}")
        _check_int("value_bits", self.value_bits, VALUE_BITS)
        if self.value_group_size is not None:
            _check_int("value_group_size", self.value_group_size)
            if self.value_group_size <= 0:
                raise ValueError(f"value_group_size must be positive, got {self.value_group_size}")
            block = block_positions(self.value_bits) if self.values_quantized else 1
            if self.value_group_size % block:
                # no head_dim can mend this: say it now, not at prefill
                raise ValueError(
                    f"value_group_size ({self.value_group_size}) must be a multiple of {block} for "
                    f"{self.value_bits}-bit values (their bit planes fill whole bytes every {block} codes)"
                )
        if self.pair_layout not in PAIR_LAYOUTS:
            raise ValueError(f"pair_layout must be one of {PAIR_LAYOUTS}, got {self.pair_layout!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise TypeError(f"scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype}")

        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {tuple(SELECTIONS)}, got {self.selection!r}")
        SELECTIONS[self.selection].validate(self)
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if self.one_bit not in ONE_BIT:
            raise ValueError(f"one_bit must be one of {ONE_BIT}, got {self.one_bit!r}")

    @property
    def values_quantized(self) -> bool:
        return self.value_bits < 16

    def n_salient_pairs(self, head_dim: int) -> int:
        """floor(r * d / 2): salient RoPE pairs per KV head (Eq. 6 selection)."""
        check_head_dim(self, head_dim)
        # The epsilon keeps e.g. r=0.3, d=20 at 3 pairs despite 0.3 * 10 = 2.9999999999999996.
        return math.floor(self.ratio * (head_dim // 2) + 1e-9)

    @property
    def selector(self):
        """The `reference.channels.selection.Selection` rule named by `selection`."""

        return SELECTIONS[self.selection]

    def n_salient_channels(self, head_dim: int) -> int:
        """Channels of a KV head (of a key group, for a per-group selection) that get b_high bits."""
        check_head_dim(self, head_dim)
        return self.selector.n_high_channels(self, head_dim)

    def value_group(self, head_dim: int) -> int:
        """Channels per value quantization group for this head_dim."""
        return head_dim if self.value_group_size is None else self.value_group_size


def check_head_dim(config: PNMixConfig, head_dim: int) -> None:
    """Reject a head_dim this config cannot store, naming what is expected."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates channel pairs), got {head_dim}")
    config.selector.check_head_dim(head_dim)
    if config.values_quantized:
        group = config.value_group(head_dim)
        if head_dim % group:
            raise ValueError(f"value_group_size ({group}) must divide head_dim ({head_dim})")
        block = block_positions(config.value_bits)
        if group % block:
            raise ValueError(
                f"value_group_size ({group}) must be a multiple of {block} for "
                f"{config.value_bits}-bit values (their bit planes fill whole bytes every {block} codes)"
            )
