"""The configurations of the accuracy sweep: the paper's Fig. 3 / Table 14 families, each method's
configuration nearest each key-bit budget, the paper's main configuration, the methods compared at their own
bits, Table 8's key-only against value-only quantization, and a control that splits Fig. 3's gap: KIVI's uniform
1-bit keys reconstructed at Eq. 7's bin midpoints (PN-Mix's 1-bit reconstruction) rather than at the group ends.

Key bits are counted as the paper counts them (`reference.channels.storage.bit_widths`: payload, scales and
zeros, FP16 sinks, plus the selection metadata, over T_q = 32768 quantized tokens, the residual
excluded) at the model's head_dim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from reference import PNMixConfig, bit_widths, methods, records
from reference.methods import FP16, kivi
from reference.tokens.config import TokenPrecisionConfig

#: The paper's key-bit budgets of Fig. 3 / Table 14.
BUDGETS = (3.0, 2.5, 2.25, 2.0, 1.5)
#: Methods compared at their own bits, beside the swept families: the registry's "own-bits" methods and
#: an implementation of the conformance suite ("impl:NAME").
OWN_BITS = (*methods.names(tag="own-bits"), "impl:transformers-quanto")
#: Fields set on a run at its own bits: quanto quantizes keys and values at one width, 2 or 4 bits (2
#: here); the per-token methods take their bits per tag from a role calibration at one of its budgets
#: (average key + value bits, everything stored counted), its lowest here, the nearest to the others.
OWN_OVERRIDES = {
    "transformers-quanto": (("b_high", 2), ("b_low", 2), ("value_bits", 2)),
    "TriAxialKV": (("budget", 3.25),),
    "role-aware PN-Mix": (("budget", 3.25),),
}
#: Keys at this width are the nearly unquantized side of value-only quantization (Table 8): the cache family
#: always quantizes keys, so "values only" keeps 8-bit keys (a step of a group's range / 255: small, not float16's
#: own rounding), and its bits are stated beside its result rather than called equal to keys-only's.
NEAR_EXACT_KEY_BITS = 8
#: The design whose main configuration (the registry's default: H3(50%)L1, G = N = 128, 32 sinks, 2-bit values)
#: the paper's Table 2 reports; the sweep runs it beside its per-budget picks where no pick is it.
MAIN_DESIGN = "PN-Mix"
#: The label of the midpoint control at a budget: KIVI's pick with Eq. 7's 1-bit reconstruction.
MIDPOINT_CONTROL = "KIVI, Eq. 7 midpoints @ {budget:g}"


def main_config(pair_layout: str = "split") -> PNMixConfig:
    """The paper's main configuration of MAIN_DESIGN (the registry's default) in `pair_layout`."""
    return methods.config(methods.names(design=MAIN_DESIGN)[0], pair_layout=pair_layout)


def is_main(config: PNMixConfig | TokenPrecisionConfig) -> bool:
    """Whether `config` is the paper's main configuration (in its own pair layout)."""
    return isinstance(config, PNMixConfig) and config == main_config(config.pair_layout)


@dataclass(frozen=True)
class Run:
    """One configuration of the sweep: how the model is asked to run it, and what it is."""

    label: str  # e.g. "PN-Mix @ 2.25"
    method: str  # a method name (or "impl:NAME")
    overrides: tuple[tuple[str, object], ...]  # on top of the method's defaults
    key_bits: float | None  # as the paper counts (None: not a channel-family config)
    value_bits: float | None
    role: str  # "baseline", "budget", "own bits", "table 8"
    budget: float | None = None

    def model_kwargs(self) -> dict:
        """The "pnmix" model's arguments of this run (pretrained is added by the caller)."""
        head = (
            {"impl": self.method.removeprefix("impl:")} if self.method.startswith("impl:") else {"method": self.method}
        )
        return {**head, **{k: _arg(v) for k, v in self.overrides}}

    def model_args(self) -> str:
        """The same as lm-eval's --model_args string."""
        return ",".join(f"{k}={v}" for k, v in self.model_kwargs().items())

    def describe(self) -> dict:
        """What a result records of the run: its label and model_args as lm-eval is given them, and as data the
        design, configuration (`reference.records.config_record`; None for an implementation given by name),
        bits and budget a reader pairs runs by, and whether it is the paper's main configuration."""
        registered = self.method in methods.REGISTRY
        return {
            "paper_main": registered and is_main(self.config()),
            "label": self.label,
            "method": self.method,
            "design": methods.method(self.method).design if registered else None,
            "config": records.config_record(self.config()) if registered else None,
            "options": self.options() if registered else {},
            "model_args": self.model_args(),
            "key_bits": self.key_bits,
            "value_bits": self.value_bits,
            "role": self.role,
            "budget": self.budget,
        }

    def _fields(self) -> set[str]:
        return {f.name for f in dataclasses.fields(methods.config(self.method))}

    def config(self) -> PNMixConfig | TokenPrecisionConfig:
        """The registry method's configuration with this run's overrides of its fields."""
        return methods.config(self.method, **{k: v for k, v in self.overrides if k in self._fields()})

    def options(self) -> dict:
        """The overrides that are no configuration field: options of the cache (a per-token method's budget)."""
        return {k: _arg(v) for k, v in self.overrides if k not in self._fields()}


def _arg(value: object) -> object:
    """A torch dtype by its name ("float16"), as model_args name it; other values as they are."""
    return str(value).removeprefix("torch.") if "torch." in str(value) else value


def key_bits(config: PNMixConfig, head_dim: int) -> float:
    """The paper's total average key-cache bit-width (effective cost plus selection metadata)."""
    return bit_widths(config, head_dim).key_total


def family(design: str, head_dim: int, pair_layout: str = "split") -> list[PNMixConfig]:
    """Table 14's configurations of a design (`reference.methods.Design.table14`: PN-Mix, KIVI)."""
    of = methods.design(design)
    if of.table14 is None:
        raise ValueError(f"design must be one of {methods.designs(having='table14')}, got {design!r}")
    return of.table14(head_dim, pair_layout)


def nearest(design: str, budget: float, head_dim: int, pair_layout: str = "split") -> tuple[PNMixConfig, float]:
    """The configuration of the design's Table 14 family nearest `budget` key bits (`reference.methods.nearest`:
    ties go to the cheaper, then the first in Table 14's order), with its key bits."""
    return methods.nearest(family(design, head_dim, pair_layout), budget, lambda c: key_bits(c, head_dim))


def overrides(config: PNMixConfig, base: PNMixConfig) -> tuple[tuple[str, object], ...]:
    """The fields where `config` differs from `base`, in field order."""
    return tuple(
        (f.name, getattr(config, f.name))
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(base, f.name)
    )


def channel_run(label: str, method: str, config: PNMixConfig, head_dim: int, role: str, budget=None) -> Run:
    base = methods.config(method)
    w = bit_widths(config, head_dim)
    values = w.value_effective if config.value_bits < 16 else 16.0
    return Run(label, method, overrides(config, base), w.key_total, values, role, budget)


def plan(head_dim: int, budgets=BUDGETS, pair_layout: str = "split", own_bits=OWN_BITS) -> list[Run]:
    """Every run of the sweep: FP16; PN-Mix and KIVI nearest each budget, KIVI's values at PN-Mix's bits, and
    where KIVI's pick has 1-bit keys reconstructed at the group ends, the same pick at Eq. 7's midpoints (role
    "control", MIDPOINT_CONTROL); the paper's main configuration (role "main") where no budget picked it; the
    methods at their own bits; Table 8 (2-bit keys with exact values against 2-bit values with near-exact keys)."""
    runs = [Run(FP16, FP16, (), 16.0, 16.0, "baseline")]
    # the design under study first; each budget's configuration is named after its design's first method
    # and every design keeps the first's values (KIVI-1 would store 1-bit values), so a budget compares keys alone
    swept = sorted(methods.designs(having="table14"), key=lambda d: d != "PN-Mix")
    for budget in budgets:
        values = None
        for design in swept:
            config, _ = nearest(design, budget, head_dim, pair_layout)
            if values is None:
                values = config.value_bits
            config = dataclasses.replace(config, value_bits=values)
            base = methods.names(design=design)[0]
            runs.append(channel_run(f"{design} @ {budget:g}", base, config, head_dim, "budget", budget))
            if config.one_bit == "ends" and 1 in (config.b_high, config.b_low):
                control = dataclasses.replace(config, one_bit="midpoint")
                label = MIDPOINT_CONTROL.format(budget=budget)
                runs.append(channel_run(label, base, control, head_dim, "control", budget))
    main = main_config(pair_layout)
    if not any(r.role == "budget" and r.method in methods.REGISTRY and r.config() == main for r in runs):
        name = methods.names(design=MAIN_DESIGN)[0]
        runs.append(channel_run(f"{name} (the paper's main configuration)", name, main, head_dim, "main"))
    for name in own_bits:
        if name in methods.REGISTRY and methods.method(name).precision == methods.CHANNELS:
            config = methods.config(name, pair_layout=pair_layout)
            runs.append(channel_run(name, name, config, head_dim, "own bits"))
        else:
            impl = name.removeprefix("impl:")
            runs.append(Run(impl, name, OWN_OVERRIDES.get(impl, ()), None, None, "own bits"))
    # Table 8 at equal bits: 2-bit codes on one side, exact (or 8-bit) on the other, with the same
    # scale and zero overhead per element (keys in groups of head_dim tokens, values of head_dim channels)
    shared = {
        "pair_layout": pair_layout,
        "value_residual": "shared",
        "group_size": head_dim,
        "residual_length": head_dim,
    }
    key_only = kivi(2, **shared, value_bits=16)
    value_only = kivi(NEAR_EXACT_KEY_BITS, **shared, value_bits=2)
    runs.append(channel_run("keys only (2-bit keys, exact values)", "KIVI-2", key_only, head_dim, "table 8"))
    runs.append(channel_run("values only (2-bit values, 8-bit keys)", "KIVI-2", value_only, head_dim, "table 8"))
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two runs share a label: {labels}")
    return runs
