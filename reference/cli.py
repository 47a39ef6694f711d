"""`python -m reference`: storage and bit-width tables computed from the analytic model.

Every number printed here is computed from `reference.channels.storage` and, for the per-token
methods, `reference.tokens.config` (formula), not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import torch
from tabulate import tabulate

from reference import methods
from reference.channels.config import PNMixConfig
from reference.channels.selection import UNIFORM
from reference.channels.storage import bit_widths, storage_model
from reference.models import MODEL_SHAPES
from reference.paper import FIG6A_BATCH, FIG6B_GENERATION, MODEL, N_QUANTIZED, PROMPT
from reference.records import GIB
from reference.tokens.config import TokenPrecisionConfig, bits_per_element
from reference.tokens.config import storage_model as token_storage_model


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type of a count or a length (>= 1): a bad one is refused on one line naming the argument."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type of a count that may be 0 (0: none), refused on one line naming the argument."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """argparse type of a size or a budget: a finite number > 0 (nan and inf would pass every comparison
    or none, and fill tables with them)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type of a finite number >= 0 (a temperature: 0 is greedy)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _config_from_args(args: argparse.Namespace) -> PNMixConfig:
    return PNMixConfig(
        b_high=args.b_high,
        b_low=args.b_low,
        ratio=args.ratio,
        group_size=args.group_size,
        residual_length=args.residual_length,
        n_sink=args.n_sink,
        value_bits=args.value_bits,
        value_group_size=args.value_group_size,
    )


#: (b_H, b_L) of the paper's Table 14 bit-width sweep, the main configuration (3, 1) first.
SWEEP_PAIRS = ((3, 1), (4, 2), (4, 1), (3, 2), (2, 1), (2, 2))


def label(cfg: PNMixConfig) -> str:
    if cfg.selector is UNIFORM:
        return f"uniform {cfg.b_low}-bit G{cfg.group_size} V{cfg.value_bits} sinks {cfg.n_sink}"
    return f"H{cfg.b_high}({cfg.ratio:.0%})L{cfg.b_low} G{cfg.group_size} V{cfg.value_bits}"


def bits_rows(configs: dict[str, PNMixConfig], head_dim: int, n_quantized: int) -> list[list]:
    """One row per config: average bits and bytes per token per KV head (residual excluded)."""
    rows = []
    for name, cfg in configs.items():
        bw = bit_widths(cfg, head_dim, n_quantized)
        per_token = (bw.key_total + bw.value_effective) * head_dim / 8
        rows.append([name, bw.key_effective, bw.key_metadata, bw.key_total, bw.value_effective, per_token])
    return rows


#: Shares of low-bit tokens the per-token methods are shown at: what they store depends on the share
#: their allocation gives the low bits.
LOW_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)


def registered() -> tuple[dict[str, PNMixConfig], dict[str, TokenPrecisionConfig]]:
    """Every method of the registry (`reference.methods.names()`) with its default configuration, in table
    order, by precision family: the channel family's, then the per-token ones'."""
    family: dict[str, dict] = {methods.CHANNELS: {}, methods.TOKENS: {}}
    for name in methods.names():
        family[methods.method(name).precision][name] = methods.config(name)
    return family[methods.CHANNELS], family[methods.TOKENS]


def spread_low(config: TokenPrecisionConfig, n_tokens: int, share: float) -> torch.Tensor:
    """Bits of `n_tokens` tokens, floor(n_tokens * share) of them low, spread evenly, the rest high."""
    i = torch.arange(n_tokens, dtype=torch.float64)
    low = torch.floor((i + 1) * share) > torch.floor(i * share)
    return torch.where(low, config.low_bits, config.high_bits)


def token_rows(configs: dict[str, TokenPrecisionConfig], head_dim: int, n_tokens: int, kv_heads: int) -> list[list]:
    """Bits per element of each per-token method at every share of low tokens (`LOW_SHARES`), everything
    stored counted, the class map spread over `kv_heads` heads."""
    rows = []
    for name, cfg in configs.items():
        for share in LOW_SHARES:
            b = bits_per_element(cfg, head_dim, spread_low(cfg, n_tokens, share), kv_heads)
            rows.append([name, f"{share:.0%}", b.key, b.key_metadata, b.value, b.average])
    return rows


def model_rows(
    configs: dict[str, PNMixConfig],
    model: str,
    batch: int,
    length: int,
    token_configs: dict[str, TokenPrecisionConfig] | None = None,
) -> list[list]:
    """KV-cache bytes of every layer of `model` holding `length` tokens for each of `batch` sequences; each
    per-token method of `token_configs` at every share of low tokens (`LOW_SHARES`)."""
    shape = MODEL_SHAPES[model]
    configs = {methods.FP16: methods.config(methods.FP16), **configs}  # the baseline row, always first
    totals = {
        name: shape.layers * storage_model(cfg, batch, shape.kv_heads, shape.head_dim, length, torch.float16).total
        for name, cfg in configs.items()
    }
    for name, cfg in (token_configs or {}).items():
        for share in LOW_SHARES:
            held = token_storage_model(cfg, batch, shape.kv_heads, shape.head_dim, spread_low(cfg, length, share))
            totals[f"{name}, {share:.0%} low"] = shape.layers * sum(held.values())
    return [[name, total / GIB, totals[methods.FP16] / total] for name, total in totals.items()]


def main(argv: list[str] | None = None) -> int:
    defaults = PNMixConfig()
    parser = argparse.ArgumentParser(prog="python -m reference", description=__doc__)
    parser.add_argument("--head-dim", type=positive_int, default=128)
    parser.add_argument("--b-high", type=int, default=defaults.b_high)
    parser.add_argument("--b-low", type=int, default=defaults.b_low)
    parser.add_argument("--ratio", type=float, default=defaults.ratio)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--residual-length", type=int, default=defaults.residual_length)
    parser.add_argument("--n-sink", type=int, default=defaults.n_sink)
    parser.add_argument("--value-bits", type=int, default=defaults.value_bits)
    parser.add_argument("--value-group-size", type=int, default=None)
    parser.add_argument(
        "--n-quantized", type=positive_int, default=N_QUANTIZED, help="T_q of the bit-width convention (>= 1)"
    )
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), default=MODEL)
    parser.add_argument("--batch", type=positive_int, default=FIG6A_BATCH, help="sequences (>= 1)")
    parser.add_argument(
        "--length", type=positive_int, default=PROMPT + FIG6B_GENERATION, help="tokens per sequence (>= 1)"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also show the paper's Table 14 bit-width sweep next to the config"
    )
    parser.add_argument(
        "--methods",
        action="store_true",
        help=f"also show every compared method's default ({', '.join(methods.names())}); the per-token ones with "
        f"{', '.join(f'{s * 100:g}' for s in LOW_SHARES)}%% of their tokens low",
    )
    args = parser.parse_args(argv)
    shape = MODEL_SHAPES[args.model]
    configs, token_configs = registered() if args.methods else ({}, {})
    try:
        tokens = token_rows(token_configs, args.head_dim, args.n_quantized, shape.kv_heads)
    except ValueError as err:
        parser.error(f"--methods: the per-token methods ({', '.join(token_configs)}) cannot hold --head-dim: {err}")
    try:
        base = _config_from_args(args)
        configs["this config: " + label(base)] = base
        if args.sweep:
            for h, lo in SWEEP_PAIRS:
                if (h, lo) != (base.b_high, base.b_low):
                    cfg = dataclasses.replace(base, b_high=h, b_low=lo)
                    configs[label(cfg)] = cfg
        bits = bits_rows(configs, args.head_dim, args.n_quantized)
        models = model_rows(configs, args.model, args.batch, args.length, token_configs)
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    print(
        f"Average bits per element, head_dim {args.head_dim}, T_q = {args.n_quantized}, "
        "residual excluded (computed from reference.channels.storage)\n"
    )
    headers = ["config", "key bits", "mask bits", "key bits total", "value bits", "bytes/token/KV head"]
    print(tabulate(bits, headers=headers, tablefmt="github", floatfmt=("", ".4f", ".2e", ".4f", ".4f", ".2f")))
    if tokens:
        print(
            f"\nPer-token methods: average bits per element over {args.n_quantized} tokens, the low ones spread "
            f"evenly, everything stored counted (the class map over {shape.kv_heads} KV heads, as {shape.name})\n"
        )
        headers = ["method", "low tokens", "key bits", "metadata bits", "value bits", "average"]
        print(tabulate(tokens, headers=headers, tablefmt="github", floatfmt=("", "", ".4f", ".4f", ".4f", ".4f")))
    print(
        f"\nKV cache of {shape.name} ({shape.layers} layers, {shape.kv_heads} KV heads, head_dim "
        f"{shape.head_dim}; {shape.source}), batch {args.batch}, {args.length} tokens each, "
        "residual and sinks included (computed)\n"
    )
    print(tabulate(models, headers=["cache", "GiB", "FP16 / this"], tablefmt="github", floatfmt=".3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
