"""The method registry: every method the project compares, defined once, and the designs they configure.

A method (`Method`) is a named configuration of a design: its name as tables spell it, the design,
a configuration factory, and tags that say which tools select it. A design (`Design`) is what the
implementations implement: its precision family ("channels": one cache family, `PNMixConfig`;
"tokens": per-token precision, `TokenPrecisionConfig`), what its implementations claim in the
conformance suite (keyword arguments of `reference.contract.Capabilities`), the conformance names of
its spec and Triton implementations, and the configuration families its sweeps choose from. Every
tool, suite, sweep and the report select from here by attribute (`names(tag=...)`, `design(...)`);
a new method is one entry below plus, where it keeps other channels, its selection class
(`reference.channels.selection`).

The designs, as configurations of one cache family (same code, same accounting):
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


# What each baseline claims in the conformance suite, whichever implementation runs it
# (keyword arguments of `reference.contract.Capabilities`): the suite draws a configuration and
# `preset` turns it into that method's, so that properties the method does not claim skip.


def kivi_preset(config: PNMixConfig) -> PNMixConfig:
    """KIVI's version of a configuration: uniform keys at b_low, Eq. 2's 1-bit ends, a sliding value residual."""
    return dataclasses.replace(config, b_high=config.b_low, value_residual="sliding", **KIVI_KEYS)


def kitty_preset(config: PNMixConfig) -> PNMixConfig:
    """Kitty's version of a configuration: high-bit channels chosen per page of G keys, Eq. 7 midpoints."""
    return dataclasses.replace(config, **KITTY_KEYS)


def fp16_preset(config: PNMixConfig) -> PNMixConfig:
    """The FP16 cache, whatever the configuration: nothing quantized."""
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


# -- the registry ---------------------------------------------------------------------------------

CHANNELS, TOKENS = "channels", "tokens"
#: Tags that select methods: "gpu" (timed by the GPU suites), "fig6" and "fig7" (the methods the paper's
#: Fig. 6 and Fig. 7 show), "tiny" (the CPU harness: the two cache paths), "fidelity" (compared at their
#: default bits by the fidelity tools: end to end, long outputs), "own-bits" (the accuracy sweep at the
#: method's own bits), "baseline" (the unquantized reference every tool compares to).
TAGS = ("gpu", "fig6", "fig7", "tiny", "fidelity", "own-bits", "baseline")


def table14_pnmix(head_dim: int, pair_layout: str = "split") -> list[PNMixConfig]:
    """Table 14's PN-Mix: b_H > b_L in {4, 3, 2, 1}, G in {64, 128}, r in 0.1..0.9; residual N = G, 2-bit values."""
    bits, groups, ratios = (4, 3, 2, 1), (64, 128), tuple(round(0.1 * i, 1) for i in range(1, 10))
    return [
        pnmix(b_high=h, b_low=lo, ratio=r, group_size=g, residual_length=g, pair_layout=pair_layout)
        for h in bits
        for lo in bits
        if h > lo
        for g in groups
        for r in ratios
        if int(r * head_dim / 2) > 0
    ]


def table14_kivi(head_dim: int, pair_layout: str = "split") -> list[PNMixConfig]:
    """Table 14's KIVI: b in {2, 1}, G in {32, 64, 128}; residual R = G, values at b bits."""
    return [kivi(b, group_size=g, pair_layout=pair_layout) for b in (2, 1) for g in (32, 64, 128)]


#: Groups and value groups of the equal-bits candidates (the exact residual N = G, as KIVI's R = G).
_GROUPS, _VALUE_GROUPS = (32, 64, 128), (None, 32)


def _matched(pair_layout: str, configs: Callable[[dict], list[PNMixConfig]]) -> list[PNMixConfig]:
    out = []
    for g in _GROUPS:
        for vg in _VALUE_GROUPS:
            out += configs({"group_size": g, "residual_length": g, "value_group_size": vg, "pair_layout": pair_layout})
    return out


def matched_kivi(pair_layout: str) -> list[PNMixConfig]:
    """KIVI at equal key + value bits: keys and values at b in {2, 3, 4}, 32 sinks as the paper's comparisons keep."""
    return _matched(pair_layout, lambda common: [kivi(b, **{**common, "n_sink": 32}) for b in (2, 3, 4)])


def matched_pnmix(pair_layout: str) -> list[PNMixConfig]:
    """PN-Mix at equal key + value bits: H(b+1)(50%)L(b-1), the average key bits of KIVI-b spent by pair;
    values at 2..4 bits."""
    return _matched(
        pair_layout,
        lambda common: [
            pnmix(b_high=b + 1, b_low=b - 1, value_bits=vb, **common) for b in (2, 3, 4) for vb in (2, 3, 4)
        ],
    )


def matched_kitty(pair_layout: str) -> list[PNMixConfig]:
    """Kitty at equal key + value bits: its 4/2-bit keys, pages of G keys; values at 2..4 bits."""
    return _matched(pair_layout, lambda common: [kitty(value_bits=vb, **common) for vb in (2, 3, 4)])


@dataclass(frozen=True)
class Design:
    """What implementations implement: a precision family, claims, implementations, sweep families."""

    name: str
    precision: str  # CHANNELS or TOKENS
    claims: dict = field(default_factory=dict)  # keyword arguments of reference.contract.Capabilities
    spec: str | None = None  # conformance name of the spec's implementation
    triton: str | None = None  # conformance name of the Triton implementation
    #: Table 14's configurations (head_dim, pair_layout) -> configs: the accuracy sweep's budgets pick from it.
    table14: Callable[..., list] | None = None
    #: Configurations at equal key + value bits (pair_layout) -> configs: the equal-bits study picks from it.
    matched: Callable[[str], list] | None = None


@dataclass(frozen=True)
class Method:
    """A named configuration of a design, as the tables name it."""

    name: str
    design: str
    make: Callable[..., PNMixConfig | TokenPrecisionConfig]  # overrides as keyword arguments
    tags: frozenset[str] = frozenset()

    def config(self, **overrides) -> PNMixConfig | TokenPrecisionConfig:
        return self.make(**overrides)

    @property
    def precision(self) -> str:
        return DESIGNS[self.design].precision


def _token(config: TokenPrecisionConfig) -> Callable[..., TokenPrecisionConfig]:
    return lambda **overrides: dataclasses.replace(config, **overrides)


DESIGNS: dict[str, Design] = {
    d.name: d
    for d in (
        Design("FP16", CHANNELS, FP16_CLAIMS, spec="fp16"),
        Design("KIVI", CHANNELS, KIVI_CLAIMS, "kivi", "kivi-triton", table14_kivi, matched_kivi),
        Design("Kitty", CHANNELS, KITTY_CLAIMS, "kitty", "kitty-triton", matched=matched_kitty),
        Design("PN-Mix", CHANNELS, {}, "reference", "triton", table14_pnmix, matched_pnmix),
        Design("TriAxialKV", TOKENS, TRIAXIAL_CLAIMS, "triaxialkv", "triaxialkv-triton"),
        Design("role-aware PN-Mix", TOKENS, ROLE_AWARE_CLAIMS, "role-aware-pnmix", "role-aware-pnmix-triton"),
    )
}

#: Every method, in the order tables and figures list them (a figure's colors follow it too).
REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        Method("FP16", "FP16", fp16, frozenset({"gpu", "fig6", "fig7", "tiny", "baseline"})),
        Method("KIVI-2", "KIVI", lambda **o: kivi(2, **o), frozenset({"gpu"})),
        Method(
            "KIVI-2 +32 sinks",
            "KIVI",
            lambda **o: kivi(2, **{"n_sink": 32, **o}),
            frozenset({"fidelity", "own-bits"}),
        ),
        Method("KIVI-1", "KIVI", lambda **o: kivi(1, **o)),
        Method("Kitty", "Kitty", kitty, frozenset({"gpu", "fig7", "fidelity", "own-bits"})),
        Method("Kitty-light", "Kitty", lambda **o: kitty(light=True, **o)),
        Method("PN-Mix", "PN-Mix", pnmix, frozenset({"gpu", "fig6", "fig7", "tiny", "fidelity"})),
        Method("TriAxialKV", "TriAxialKV", _token(TokenPrecisionConfig()), frozenset({"own-bits"})),
        Method(
            "role-aware PN-Mix",
            "role-aware PN-Mix",
            _token(TokenPrecisionConfig(low_keys="pairs")),
            frozenset({"own-bits"}),
        ),
    )
}
#: The unquantized baseline's name.
FP16 = "FP16"


def method(name: str) -> Method:
    """The method of this name; ValueError naming every method otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"method must be one of {list(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def design(name: str) -> Design:
    """The design of this name; ValueError naming every design otherwise."""
    if name not in DESIGNS:
        raise ValueError(f"design must be one of {list(DESIGNS)}, got {name!r}")
    return DESIGNS[name]


def config(name: str, **overrides) -> PNMixConfig | TokenPrecisionConfig:
    """The named method's configuration with `overrides` applied."""
    return method(name).config(**overrides)


def names(*, precision: str | None = None, tag: str | None = None, design: str | None = None) -> tuple[str, ...]:
    """The methods with these attributes, in table order."""
    if tag is not None and tag not in TAGS:
        raise ValueError(f"tag must be one of {TAGS}, got {tag!r}")
    return tuple(
        m.name
        for m in REGISTRY.values()
        if (precision is None or m.precision == precision)
        and (tag is None or tag in m.tags)
        and (design is None or m.design == design)
    )


def designs(*, precision: str | None = None, having: str | None = None) -> tuple[str, ...]:
    """The designs of this precision family (and with this family attribute set: "table14", "matched")."""
    return tuple(
        d.name
        for d in DESIGNS.values()
        if (precision is None or d.precision == precision) and (having is None or getattr(d, having) is not None)
    )


def nearest(family: Sequence, budget: float, bits: Callable[[object], float]) -> tuple[object, float]:
    """The configuration of `family` whose `bits` is nearest `budget` (ties: the cheaper, then the first
    listed), with its bits: how every sweep picks a family's configuration at a bit budget."""
    if not family:
        raise ValueError("family must hold at least one configuration")
    scored = [(abs(b - budget), b, i) for i, b in enumerate(bits(c) for c in family)]
    _, best, index = min(scored)
    return family[index], best


#: Views by precision family, for the callers that take one family: name -> factory, name -> config.
METHODS: dict[str, Callable[..., PNMixConfig]] = {n: REGISTRY[n].make for n in names(precision=CHANNELS)}
TOKEN_METHODS: dict[str, TokenPrecisionConfig] = {n: REGISTRY[n].config() for n in names(precision=TOKENS)}
#: The channel family's names in table order.
NAMES = tuple(METHODS)
