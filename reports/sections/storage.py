"""Section 3: storage and bit widths of every compared method and of the paper's bit-width sweep,
computed by `reference.cli`'s table functions (the numbers `python -m reference --methods --sweep` prints)."""

from __future__ import annotations

import dataclasses

from reference import PNMixConfig, bit_widths
from reference.cli import SWEEP_PAIRS, bits_rows, label, model_rows
from reference.methods import EVERY_TOKEN, METHODS
from reference.models import MODEL_SHAPES

from ..markdown import CONFIRMED, NOT_CONFIRMED, Claim, Section, table
from ..provenance import computed

HEAD_DIM, N_QUANTIZED = 128, 32768  # the paper's convention: d = 128, T_q = 32768
MODEL, BATCH, LENGTH = "Qwen3-8B", 32, 8192 + 141  # Fig. 6's model, B = 32, P + L_gen
PAPER_PN_MIX_BITS = (2.26, 2.28)  # the paper's PN-Mix key bit-widths across its variants


def configs() -> dict[str, PNMixConfig]:
    """Every method's default, then H{b_H}(50%)L{b_L} at G = 128 and 64 (values 2-bit, 32 sinks)."""
    out = {name: make() for name, make in METHODS.items()}
    for group in (128, 64):
        for high, low in SWEEP_PAIRS:
            cfg = PNMixConfig(b_high=high, b_low=low, group_size=group, residual_length=group)
            if cfg not in out.values():  # the main config is PN-Mix's default, listed already
                out[label(cfg)] = cfg
    return out


def _show(value: object) -> str:
    return "every token" if value == EVERY_TOKEN else str(value)


def claims() -> list[Claim]:
    bw = bit_widths(PNMixConfig(), HEAD_DIM, N_QUANTIZED)
    lo, hi = PAPER_PN_MIX_BITS
    holds = round(bw.key_effective, 2) >= lo and round(bw.key_total, 2) <= hi
    return [
        Claim(
            "PN-Mix (H3(50%)L1, G = 128, 32 FP16 sinks) stores keys in about 2.26 bits per element, 2.26-2.28 "
            "across its variants (Appendix, storage accounting)",
            CONFIRMED if holds else NOT_CONFIRMED,
            "computed",
            f"effective key bits {bw.key_effective:.4f}, with the pair mask {bw.key_total:.4f} (d = {HEAD_DIM}, "
            f"T_q = {N_QUANTIZED})",
            computed("reference.storage.bit_widths(PNMixConfig(), 128, 32768)"),
        )
    ]


def render() -> Section:
    cfgs = configs()
    bits = bits_rows(cfgs, HEAD_DIM, N_QUANTIZED)
    shape = MODEL_SHAPES[MODEL]
    models = model_rows({k: v for k, v in cfgs.items() if k != "FP16"}, MODEL, BATCH, LENGTH)
    details = [[name, *(_show(v) for v in dataclasses.astuple(cfg)[:8])] for name, cfg in cfgs.items()]
    fields = [f.name for f in dataclasses.fields(PNMixConfig)][:8]
    body = "\n".join(
        [
            f"Average bits per element of keys and values, head_dim {HEAD_DIM}, T_q = {N_QUANTIZED} quantized tokens, "
            'the FP16 residual excluded (the paper\'s convention). "key bits" is the effective cost (payload, '
            "scales and zeros, FP16 sinks); \"mask bits\" the selection metadata (PN-Mix's pair mask, Kitty's "
            'per-page channel indices); "key bits total" their sum. Bits are counted as stored: packed fields are '
            "1, 2, 4 or 8 bits wide and never straddle a byte, so a 3-bit plane (the upper plane of H4L1) occupies "
            "4-bit fields (`reference.config.field_width`), where the paper's formula would count 3.\n",
            table(
                bits,
                ["config", "key bits", "mask bits", "key bits total", "value bits", "bytes/token/KV head"],
                computed(
                    f"reference.cli.bits_rows -> reference.storage.bit_widths(config, head_dim={HEAD_DIM}, "
                    f"n_quantized={N_QUANTIZED})"
                ),
                floatfmt=("", ".4f", ".2e", ".4f", ".4f", ".2f"),
            ),
            "Paper (quoted): PN-Mix about 2.26 bits, 2.26-2.28 across its variants; comparisons at 2.25-2.4 bits.\n",
            f"### KV cache of {shape.name} at B = {BATCH}, {LENGTH} tokens per sequence\n",
            f"{shape.layers} layers, {shape.kv_heads} KV heads, head_dim {shape.head_dim} ({shape.source}); sinks and "
            "residual included.\n",
            table(
                models,
                ["cache", "GiB", "FP16 / this"],
                computed(
                    f"reference.cli.model_rows -> reference.storage.storage_model(config, {BATCH}, "
                    f"{shape.kv_heads}, {shape.head_dim}, {LENGTH}) x {shape.layers} layers"
                ),
                floatfmt=".3f",
            ),
            "<details><summary>Configurations</summary>\n",
            table(details, ["config", *fields], computed("reference.methods.METHODS and reference.config.PNMixConfig")),
            "</details>\n",
        ]
    )
    return Section("Storage and bit widths", body, claims=claims())
