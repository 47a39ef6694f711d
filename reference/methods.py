"""The methods the paper compares, as configurations of one cache family (same code, same accounting).

- PN-Mix: `PNMixConfig()`, pairs chosen once from the prompt (Eq. 6), H3(50%)L1, Eq. 7 at 1 bit.
- KIVI (jy-yuan/KIVI), as its published code: keys b-bit per channel in groups of G tokens,
  an FP16 key residual of R = G tokens quantized whole when it fills (Eq. 2, 1-bit groups at
  the group ends); values b-bit per token over the head dim, and a sliding window of the R
  newest values in FP16: once it is full, each new token quantizes the oldest value of the
  window (`value_residual="sliding"`; `reference.contract.RESIDUAL_POLICIES` "sliding_values").
  Mapping: residual_length = group_size = R; prefill quantizes all but the last T mod R keys and
  all but the last R values, as the published prefill does; its public code keeps no sink
  tokens (n_sink=0), the paper's comparisons keep 32 (`kivi(n_sink=32)`). `kivi(...,
  value_residual="shared")` flushes values with the keys instead (0 to R - 1 exact values
  instead of R), which the tables do not list: a value, once quantized, has the same codes
  either way, since values are quantized per token.
- Kitty (Summer-Summer/Kitty): pages of 128 tokens; per page the d/4 channels of largest mean
  |k| over that page's keys get 4 bits (d/8 in the light variant), the rest 2 bits, as a 2-bit
  low plane for every channel plus a 2-bit high plane for the boosted ones; a per-page channel
  index of d bytes; FP16 scale and min per (channel, page); 32 FP16 sinks; 2-bit values per
  token over the full head dim.
- FP16: every token kept exact; expressed as a cache whose exact (sink) region has room for
  every token, so that its bytes come from the same accounting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from reference.channels.config import KEY_BITS, PNMixConfig
from reference.channels.selection import PAGE_CHANNELS, UNIFORM
from reference.tokens.config import TokenPrecisionConfig

EVERY_TOKEN = 2**62  # an exact region longer than any sequence
#: How each baseline treats keys, whatever its bits, group and sinks.
KIVI_KEYS = {"ratio": 0.0, "selection": UNIFORM.name, "one_bit": "ends"}
KITTY_KEYS = {"selection": PAGE_CHANNELS.name, "one_bit": "midpoint"}


def pnmix(**overrides) -> PNMixConfig:
    return PNMixConfig(**overrides)


def kivi(bits: int = 2, group_size: int = 128, n_sink: int = 0, **overrides) -> PNMixConfig:
    """KIVI-b with group size G (and residual R = G), keys and values at b bits, sliding value window."""
    return PNMixConfig(
        **{
            "b_high": bits,
            "b_low": bits,
            **KIVI_KEYS,
            "group_size": group_size,
            "residual_length": group_size,
            "n_sink": n_sink,
            "value_bits": bits,
            "value_group_size": None,
            "value_residual": "sliding",
            **overrides,
        }
    )


def kitty(light: bool = False, **overrides) -> PNMixConfig:
    """Kitty: 4-bit boosted channels (d/4, or d/8 when light) chosen per 128-token page, 2-bit rest."""
    return PNMixConfig(
        **{
            "b_high": 4,
            "b_low": 2,
            "ratio": 0.125 if light else 0.25,
            **KITTY_KEYS,
            "group_size": 128,
            "residual_length": 128,
            "n_sink": 32,
            "value_bits": 2,
            "value_group_size": None,
            **overrides,
        }
    )


def fp16(**overrides) -> PNMixConfig:
    """The unquantized cache: every token exact (16-bit keys and values)."""
    return PNMixConfig(
        **{"b_high": 1, "b_low": 1, "selection": UNIFORM.name, "n_sink": EVERY_TOKEN, "value_bits": 16, **overrides}
    )


#: Default configuration of each method, by the name the tables use.
METHODS: dict[str, Callable[..., PNMixConfig]] = {
    "FP16": fp16,
    "KIVI-2": lambda **o: kivi(2, **o),
    "KIVI-2 +32 sinks": lambda **o: kivi(2, **{"n_sink": 32, **o}),
    "KIVI-1": lambda **o: kivi(1, **o),
    "Kitty": kitty,
    "Kitty-light": lambda **o: kitty(light=True, **o),
    "PN-Mix": pnmix,
}

#: Every method's name in the order tables and figures list them (a figure's colors follow it too).
NAMES = tuple(METHODS)

#: The per-token precision methods (`reference.tokens.config`): TriAxialKV, and role-aware PN-Mix
#: (its per-tag budget with PN-Mix's pairs in the low tokens' keys), by the names tables use.
TOKEN_METHODS = {"TriAxialKV": TokenPrecisionConfig(), "role-aware PN-Mix": TokenPrecisionConfig(low_keys="pairs")}


# What each baseline claims in the conformance suite, whichever implementation runs it
# (keyword arguments of `reference.contract.Capabilities`): the suite draws a configuration and
# `preset` turns it into that method's, so that properties the method does not claim skip.


def kivi_preset(config: PNMixConfig) -> PNMixConfig:
    return dataclasses.replace(config, b_high=config.b_low, value_residual="sliding", **KIVI_KEYS)


def kitty_preset(config: PNMixConfig) -> PNMixConfig:
    return dataclasses.replace(config, **KITTY_KEYS)


def fp16_preset(config: PNMixConfig) -> PNMixConfig:
    return fp16()


KIVI_CLAIMS = {
    "prefill_selection": False,
    "preset": kivi_preset,
    "midpoint_one_bit": False,
    "key_bits": frozenset((b, b) for b in KEY_BITS),
    "residual": "sliding_values",
}
KITTY_CLAIMS = {"prefill_selection": False, "preset": kitty_preset, "key_bits": frozenset({(4, 2), (4, 1), (2, 1)})}
FP16_CLAIMS = {"prefill_selection": False, "preset": fp16_preset, "midpoint_one_bit": False}
TRIAXIAL_CLAIMS = {"channel_precision": False, "token_precision": frozenset({"channels"}), "prefill_selection": False}
ROLE_AWARE_CLAIMS = {"channel_precision": False, "token_precision": frozenset({"pairs"}), "prefill_selection": False}
