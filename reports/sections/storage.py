"""Section 3: storage and bit widths of every compared method and of the paper's bit-width sweep,
computed by `reference.cli`'s table functions (the numbers `python -m reference --methods --sweep` prints)."""

from __future__ import annotations

import dataclasses

from reference import PNMixConfig, bit_widths, paper
from reference.cli import SWEEP_PAIRS, bits_rows, label, model_rows, spread_low, token_rows
from reference.methods import EVERY_TOKEN, METHODS, TOKEN_METHODS
from reference.models import MODEL_SHAPES
from reference.tokens.config import TokenPrecisionConfig, bits_per_element
from reports.markdown import CONFIRMED, NOT_CONFIRMED, Claim, Section, table
from reports.provenance import computed

HEAD_DIM, N_QUANTIZED = 128, paper.N_QUANTIZED  # the paper's convention: d = 128, T_q = 32768
MODEL, BATCH, LENGTH = paper.MODEL, paper.FIG6A_BATCH, paper.PROMPT + paper.FIG6B_GENERATION  # Fig. 6: B, P + L_gen
_BITS = (
    f"about {paper.PN_MIX_KEY_BITS} bits per element, {'-'.join(map(str, paper.PN_MIX_KEY_BITS_RANGE))} across "
    "its variants"
)


def configs() -> dict[str, PNMixConfig]:
    """Every method's default, then H{b_H}(50%)L{b_L} at G = 128 and 64 (values 2-bit, 32 sinks)."""
    out = {name: make() for name, make in METHODS.items()}
    for group in (128, 64):
        for high, low in SWEEP_PAIRS:
            cfg = PNMixConfig(b_high=high, b_low=low, group_size=group, residual_length=group)
            if cfg not in out.values():  # the main config is PN-Mix's default, listed already
                out[label(cfg)] = cfg
    return out


TOKEN_LENGTH = 32768

#: How every section names a configuration's bits: this section's count, so that one configuration has one number.
COUNT_NAME = "bits / element (section 3's count)"
COUNT_RULE = (
    f"section 3's count: head_dim {HEAD_DIM}, {N_QUANTIZED} quantized tokens, the exact residual excluded "
    "(the paper's convention); a per-token method at its share of low tokens"
)


def count(config: PNMixConfig | TokenPrecisionConfig, low_share: float = 0.5) -> tuple[float, float, float]:
    """(average, keys, values) bits per element of a configuration as this section counts it: a channel
    configuration's key bits total and value bits (`bit_widths`, as the first table), a per-token one's at
    `low_share` of its tokens low (as the per-token table, over the model's KV heads)."""
    if isinstance(config, TokenPrecisionConfig):
        kv_heads = MODEL_SHAPES[MODEL].kv_heads
        b = bits_per_element(config, HEAD_DIM, spread_low(config, TOKEN_LENGTH, low_share), kv_heads)
        return b.average, b.key + b.key_metadata, b.value
    bw = bit_widths(config, HEAD_DIM, N_QUANTIZED)
    return (bw.key_total + bw.value_effective) / 2, bw.key_total, bw.value_effective


def count_text(config: PNMixConfig | TokenPrecisionConfig, low_share: float = 0.5) -> str:
    """'2.26 (K 2.26, V 2.26)': `count`, as every section prints it."""
    average, keys, values = count(config, low_share)
    return f"{average:.2f} (K {keys:.2f}, V {values:.2f})"


def _show(value: object) -> str:
    return "every token" if value == EVERY_TOKEN else str(value)


def claims() -> list[Claim]:
    bw = bit_widths(PNMixConfig(), HEAD_DIM, N_QUANTIZED)
    lo, hi = paper.PN_MIX_KEY_BITS_RANGE
    holds = round(bw.key_effective, 2) >= lo and round(bw.key_total, 2) <= hi
    return [
        Claim(
            f"PN-Mix (H3(50%)L1, G = 128, 32 FP16 sinks) stores keys in {_BITS} (Appendix, storage accounting)",
            CONFIRMED if holds else NOT_CONFIRMED,
            "computed",
            f"effective key bits {bw.key_effective:.4f}, with the pair mask {bw.key_total:.4f} (d = {HEAD_DIM}, "
            f"T_q = {N_QUANTIZED})",
            computed(f"reference.channels.storage.bit_widths(PNMixConfig(), {HEAD_DIM}, {N_QUANTIZED})"),
        )
    ]


def render() -> Section:
    cfgs = configs()
    bits = bits_rows(cfgs, HEAD_DIM, N_QUANTIZED)
    shape = MODEL_SHAPES[MODEL]
    models = model_rows({k: v for k, v in cfgs.items() if k != "FP16"}, MODEL, BATCH, LENGTH)
    fields = [*(f.name for f in dataclasses.fields(PNMixConfig)[:8]), "value_residual"]
    details = [[name, *(_show(getattr(cfg, f)) for f in fields)] for name, cfg in cfgs.items()]
    body = "\n".join(
        [
            f"Average bits per element of keys and values, head_dim {HEAD_DIM}, T_q = {N_QUANTIZED} quantized tokens, "
            "the FP16 residual excluded (the paper's convention; with KIVI's sliding value window, its R exact "
            'values too). "key bits" is the effective cost (payload, '
            "scales and zeros, FP16 sinks); \"mask bits\" the selection metadata (PN-Mix's pair mask, Kitty's "
            'per-page channel indices); "key bits total" their sum. Bits are counted as stored, and a b-bit code '
            "is stored in exactly b bits: split into bit planes of 4, 2 and 1 bits "
            "(`reference.equations.packing.bit_planes`; "
            "the 3 upper bits of H4L1 in a 2-bit and a 1-bit plane), as the paper's formula counts.\n",
            table(
                bits,
                ["config", "key bits", "mask bits", "key bits total", "value bits", "bytes/token/KV head"],
                computed(
                    f"reference.cli.bits_rows -> reference.channels.storage.bit_widths(config, head_dim={HEAD_DIM}, "
                    f"n_quantized={N_QUANTIZED})"
                ),
                floatfmt=("", ".4f", ".2e", ".4f", ".4f", ".2f"),
            ),
            f"Paper (quoted): PN-Mix {_BITS}; comparisons at {'-'.join(map(str, paper.COMPARISON_BITS))} bits.\n",
            f"### KV cache of {shape.name} at B = {BATCH}, {LENGTH} tokens per sequence\n",
            f"{shape.layers} layers, {shape.kv_heads} KV heads, head_dim {shape.head_dim} ({shape.source}); sinks and "
            "residual included.\n",
            table(
                models,
                ["cache", "GiB", "FP16 / this"],
                computed(
                    f"reference.cli.model_rows -> reference.channels.storage.storage_model(config, {BATCH}, "
                    f"{shape.kv_heads}, {shape.head_dim}, {LENGTH}) x {shape.layers} layers"
                ),
                floatfmt=".3f",
            ),
            "### Per-token precision (TriAxialKV, role-aware PN-Mix)\n",
            "Their cost depends on the share of low (INT2) tokens their allocation gives; every stored byte counted: "
            f"payload, scales and zeros (G = 32, float16), the leftover's high-bit keys, the class map (1 byte per "
            f"token and layer, here over {shape.kv_heads} KV heads) and role-aware PN-Mix's pair mask; "
            f"{TOKEN_LENGTH} tokens with the low ones spread evenly, head_dim {HEAD_DIM}.\n",
            table(
                token_rows(TOKEN_METHODS, HEAD_DIM, TOKEN_LENGTH, shape.kv_heads),
                ["method", "low tokens", "key bits", "metadata bits", "value bits", "average"],
                computed(
                    f"reference.tokens.config.bits_per_element(config, {HEAD_DIM}, token_bits, "
                    f"kv_heads={shape.kv_heads})"
                ),
                floatfmt=("", "", ".4f", ".4f", ".4f", ".4f"),
            ),
            "<details><summary>Configurations</summary>\n",
            table(
                details,
                ["config", *fields],
                computed("reference.methods.METHODS and reference.channels.config.PNMixConfig"),
            ),
            "</details>\n",
        ]
    )
    return Section("Storage and bit widths", body, claims=claims())
