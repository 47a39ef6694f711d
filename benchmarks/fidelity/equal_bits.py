"""Channels or token roles? Every method at matched average key + value bits, on one harness.

    pnmix-equal-bits [--model M] [--budgets 3.25 3.5 4] [--layers 5] [--long-tokens 512]
                                    [--chunk 128] [--smoke] [--out DIR] [--chat-template FILE]

Methods: FP16; KIVI, Kitty and PN-Mix (bits spent per channel); TriAxialKV (per token, by role tag:
arXiv 2605.17170); role-aware PN-Mix (TriAxialKV's per-tag budget with PN-Mix's pair saliency in
the low tokens' keys, `reference.tokens.config`).

Bits: the average of key and value bits per element with everything a cache stores for its quantized
tokens counted (payload, scales, zeros, sinks, selection metadata): `reference.channels.storage.bit_widths`
(residual excluded, 32K tokens) for the channel methods, the allocator's average for the token methods
(INT2 costs 3 bits and INT4 5 at G = 32 with float16 scales: TriAxialKV cannot go below 3). At each
budget every channel method takes the configuration of its family nearest to it (`candidates`); each
row says the bits it has, and what it stores on the evaluated sequences (everything, exact residual
and sinks included).

Steps, on SmolLM2-135M-Instruct by default:
1. calibration (split "calibration" of `benchmarks.fidelity.conversations`): per-tag distortion for
   TriAxialKV's store and for role-aware PN-Mix's (`benchmarks.fidelity.role_calibration`), and the
   allocator's bits per tag at each budget; a tag never seen in calibration gets the high bits;
2. attention (split "evaluation"): the prefill's q, k, v of `--layers` layers spread across depth;
   each method stores the whole conversation; the queries of the last assistant message attend:
   KL(exact || method) of the attention distribution and the MSE of the attention output (mean
   over heads, positions and layers, then over conversations);
3. end to end: each evaluation conversation teacher-forced, its last assistant message through
   each cache (stepwise: as token-by-token decoding): KL(FP16 || method) of the next token, top-1
   agreement and NLL of the conversation's own tokens;
4. long outputs: FP16 greedy continuations (`--long-tokens`) of each evaluation conversation's last
   turn, teacher-forced through each cache: the same metrics over output positions (binned);
   generated tokens take the bits of the tag (current turn, text, answer);
5. memory (computed from formulas): Fig. 6a/6b feasibility of every method at each budget
   (`benchmarks.efficiency.memory` with each method's exact storage model).
Writes JSON and markdown atomically to new files; the report reads the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import time

import torch
from tabulate import tabulate
from tqdm import tqdm

from benchmarks.accuracy.stats import resolution, sign_test
from benchmarks.canaries import behaviour as canaries
from benchmarks.canaries import workloads
from benchmarks.canaries.outcome import outcome
from benchmarks.commands import preflight
from benchmarks.commands.saving import write_result
from benchmarks.efficiency import memory
from benchmarks.fidelity import conversations, long_output, role_calibration
from benchmarks.fidelity.long_output import binned, greedy_outputs, measure_sequence, quarter_means
from benchmarks.fidelity.role_calibration import allocations, cache_layers, calibrate, capture
from benchmarks.models.chat_format import add_options
from benchmarks.models.source import DEFAULT as DEFAULT_MODEL
from reference import ReferenceCache, bit_widths, methods, schema, storage_model
from reference.cli import positive_int
from reference.equations.attention import attention_logits_ref, attention_ref
from reference.methods import TOKEN_METHODS as TOKEN_CONFIGS
from reference.methods import fp16, pnmix
from reference.paper import FIG6A_BATCH, FIG6B_GENERATION
from reference.records import record
from reference.tokens.allocation import token_bits
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig
from reference.tokens.config import storage_model as token_storage_model
from reference.tokens.roles import GENERATED, tag_conversation

DEFAULT_BUDGETS = (3.25, 3.5, 4.0)
#: The channel designs, each at its configuration nearest a budget, and the per-token methods, by calibration.
CHANNEL_METHODS = methods.designs(precision=methods.CHANNELS, having="matched")  # KIVI, Kitty, PN-Mix
TOKEN_METHODS = methods.names(precision=methods.TOKENS)  # TriAxialKV, role-aware PN-Mix
METHODS = (methods.FP16, *CHANNEL_METHODS, *TOKEN_METHODS)
METRICS = ("kl", "top1", "nll")


# -- matching bits --------------------------------------------------------------------------------


def candidates(design: str, pair_layout: str) -> list:
    """The configurations of a channel design that a budget may pick (`reference.methods.Design.matched`)."""
    if design not in CHANNEL_METHODS:
        raise ValueError(f"method must be one of {CHANNEL_METHODS}, got {design!r}")
    return methods.design(design).matched(pair_layout)


def channel_bits(config, head_dim: int) -> float:
    """Average key + value bits per element (`bit_widths`: key payload, scales, zeros, sinks and metadata)."""
    w = bit_widths(config, head_dim)
    return (w.key_total + w.value_effective) / 2


#: How a channel method's bits are matched to a budget: "asymptotic" (`channel_bits`, exact residual
#: excluded, the papers' convention) or "stored" (everything its cache holds for the evaluated
#: conversations, exact residual and sinks included: equal memory on this workload).
MATCHES = ("asymptotic", "stored")


def matched(method: str, budget: float, head_dim: int, pair_layout: str, stored_at: tuple | None = None):
    """(config, bits) of the method's candidate nearest to `budget` (the cheaper one on a tie): by
    `channel_bits`, or with stored_at = (kv_heads, head_dim, lengths) by the mean `stored_bits` over
    sequences of those lengths."""

    def bits(c) -> float:
        if stored_at is None:
            return channel_bits(c, head_dim)
        kv_heads, d, lengths = stored_at
        return statistics.fmean(stored_bits(method, c, kv_heads, d, n, None) for n in lengths)

    config, _ = methods.nearest(candidates(method, pair_layout), budget, bits)
    return config, channel_bits(config, head_dim)


def describe(config) -> str:
    keys = (
        f"H{config.b_high}({config.ratio:.0%})L{config.b_low}"
        if config.b_high != config.b_low
        else f"{config.b_low}-bit"
    )
    vg = config.value_group_size or "d"
    return f"keys {keys} G={config.group_size}, values {config.value_bits}-bit per {vg} channels, {config.n_sink} sinks"


# -- measurements ---------------------------------------------------------------------------------


def stored_kv(method: str, setting, q, k, v, bits) -> tuple[torch.Tensor, torch.Tensor]:
    """What a method's cache holding the whole sequence gives back: k, v float32 [1, H_kv, T, d]."""
    if method == "FP16":
        return k.float(), v.float()
    if method in TOKEN_METHODS:
        cache = TokenPrecisionCache(setting)
        cache.prefill(q, k, v, bits)
    else:
        cache = ReferenceCache.from_prefill(q, k, v, setting)
    return cache.dequantize()


def attention_errors(q, k, v, k_hat, v_hat, start: int, scale: float) -> tuple[float, float]:
    """(KL(exact || method) of the attention of queries start.. , MSE of their attention output)."""
    qe = q[..., start:, :]
    exact = torch.log_softmax(attention_logits_ref(qe, k, scale=scale, causal=True), -1)
    approx = torch.log_softmax(attention_logits_ref(qe, k_hat, scale=scale, causal=True), -1)
    kl = (exact.exp() * (exact - approx).nan_to_num(0.0, 0.0, 0.0)).sum(-1).mean()
    out = attention_ref(qe, k, v, scale=scale, causal=True)
    out_hat = attention_ref(qe, k_hat, v_hat, scale=scale, causal=True)
    return float(kl), float(((out - out_hat) ** 2).mean())


def stored_bits(method: str, setting, kv_heads: int, head_dim: int, length: int, bits) -> float:
    """Average key + value bits per element a method's cache stores for one sequence, everything counted."""
    elements = 2 * kv_heads * length * head_dim
    if method == "FP16":
        return 16.0
    if method in TOKEN_METHODS:
        return 8 * sum(token_storage_model(setting, 1, kv_heads, head_dim, bits).values()) / elements
    return 8 * storage_model(setting, 1, kv_heads, head_dim, length).total / elements


def memory_rows(settings: dict, low_share: dict, budget_gib: float, arch_name: str = "Qwen3-8B") -> list[dict]:
    """Fig. 6a (longest generation at B = 32) and Fig. 6b (largest batch at 8K) of every method, from each
    one's exact storage model (a token method: its low tokens at the share measured on the evaluation split)."""
    arch = memory.ARCHITECTURES[arch_name]
    s = arch.shape
    rows = []
    for method, setting in settings.items():
        if method in TOKEN_METHODS:
            share = low_share[method]

            def cache_fn(batch, capacity, setting=setting, share=share):
                n_low = round(share * capacity)
                bits = torch.tensor([setting.low_bits] * n_low + [setting.high_bits] * (capacity - n_low))
                return s.layers * batch * sum(token_storage_model(setting, 1, s.kv_heads, s.head_dim, bits).values())
        else:

            def cache_fn(batch, capacity, setting=setting):
                return (
                    s.layers * storage_model(setting, batch, s.kv_heads, s.head_dim, capacity, capacity=capacity).total
                )

        kw = {"budget_gib": budget_gib, "cache_fn": cache_fn}
        longest = None
        for g in memory.FIG6A_GENERATION:
            if not memory.point(arch, method, FIG6A_BATCH, g, **kw).fits:
                break
            longest = g
        best = memory.max_batch(arch, method, FIG6B_GENERATION, **kw)
        cache = memory.point(arch, method, FIG6A_BATCH, FIG6B_GENERATION, **kw).cache
        rows.append(
            {
                "method": method,
                "fig6a_longest_generation": longest,
                "fig6b_max_batch": best.batch if best else 0,
                "cache_gib_at_b32_8k": cache / 2**30,
            }
        )
    return rows


def method_caches(model_config, settings: dict, alloc: dict, tags) -> dict:
    """What `long_output.measure_sequence` reads each quantized method through: a channel method's config,
    or a function making a token method's cache with each token's bits from its tag."""
    from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import

    out = {}
    for m, setting in settings.items():
        if m in TOKEN_METHODS:
            bits = token_bits(tags, alloc[m], setting)
            gen = alloc[m].get(str(GENERATED), setting.high_bits)
            out[m] = functools.partial(
                PNMixHFCache,
                model_config,
                setting,
                backend="reference",
                stepwise=True,
                token_bits=bits,
                generated_bits=gen,
            )
        elif m != "FP16":
            out[m] = setting
    return out


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.fmean(xs) if xs else math.nan


# -- the run --------------------------------------------------------------------------------------


def run(
    model,
    tokenizer,
    calibration_rows,
    evaluation_rows,
    *,
    budgets,
    layers,
    long_tokens,
    chunk,
    bins,
    pair_layout,
    budget_gib=40.0,
    match: str = "asymptotic",
) -> dict:
    from pnmix.hf import head_dim  # deferred: transformers takes seconds to import

    d = head_dim(model.config)
    kv_heads = model.config.num_key_value_heads
    token_configs = {name: dataclasses.replace(cfg, pair_layout=pair_layout) for name, cfg in TOKEN_CONFIGS.items()}
    cal_captured = capture(model, tokenizer, calibration_rows, layers)
    calibrations = {
        n: calibrate(model, tokenizer, calibration_rows, layers, c, captured=cal_captured)
        for n, c in token_configs.items()
    }
    allocated = {n: allocations(calibrations[n], budgets, c) for n, c in token_configs.items()}
    evaluation = capture(model, tokenizer, evaluation_rows, layers)
    starts = []
    for row, (ids, _, _) in zip(evaluation_rows, evaluation, strict=True):
        prompt_ids, _ = tag_conversation(tokenizer, row["messages"][:-1], add_generation_prompt=True)
        if list(ids[: len(prompt_ids)]) != list(prompt_ids):
            raise RuntimeError(f"conversation {row['id']}: its prompt does not tokenize as a prefix of the whole")
        starts.append(len(prompt_ids))
    context = getattr(model.config, "max_position_embeddings", None) or math.inf
    long_prompts = [row["messages"][:-1] for row in evaluation_rows]
    long_seqs = greedy_outputs(model, tokenizer, long_prompts, long_tokens, context) if long_tokens else []
    long_tags = [tag_conversation(tokenizer, m, add_generation_prompt=True)[1] for m in long_prompts]
    results = []
    for bi, budget in enumerate(budgets):
        settings = {"FP16": fp16(pair_layout=pair_layout)}
        rows = {"FP16": {"bits": 16.0, "config": "exact"}}
        for m in CHANNEL_METHODS:
            at = (kv_heads, d, [len(ids) for ids, _, _ in evaluation]) if match == "stored" else None
            settings[m], bits = matched(m, budget, d, pair_layout, at)
            rows[m] = {"bits": bits, "config": describe(settings[m])}
        alloc = {}
        for m, cfg in token_configs.items():
            a = allocated[m][bi]
            alloc[m] = dict(zip(calibrations[m]["tags"], a["bits"], strict=True))
            settings[m] = cfg
            rows[m] = {
                "bits": a["average_bits"],
                "config": f"INT{cfg.low_bits}/INT{cfg.high_bits} by tag, G="
                f"{cfg.group_size}, low keys {'H3(50%)L1 pairs' if cfg.low_keys == 'pairs' else 'per channel'}",
                "int2_tags": sum(b == cfg.low_bits for b in a["bits"]),
                "tags": len(a["bits"]),
            }
        # 2. attention at the captured layers
        per = {m: {"attention_kl": [], "output_mse": [], "stored_bits": [], "low_share": []} for m in settings}
        for (ids, tags, seen), start in zip(evaluation, starts, strict=True):
            for m, setting in settings.items():
                bits = token_bits(tags, alloc[m], setting) if m in TOKEN_METHODS else None
                kls, mses = [], []
                for layer in layers:
                    q, k, v, scale = seen[layer]
                    k_hat, v_hat = stored_kv(m, setting, q[None].float(), k[None].float(), v[None].float(), bits)
                    kl, mse = attention_errors(
                        q[None].float(), k[None].float(), v[None].float(), k_hat, v_hat, start, scale
                    )
                    kls.append(kl)
                    mses.append(mse)
                per[m]["attention_kl"].append(_mean(kls))
                per[m]["output_mse"].append(_mean(mses))
                per[m]["stored_bits"].append(stored_bits(m, setting, kv_heads, d, len(ids), bits))
                if bits is not None:
                    per[m]["low_share"].append(float((bits == setting.low_bits).double().mean()))
        for m in settings:
            rows[m] |= {name: _mean(xs) for name, xs in per[m].items() if xs}

        # 3. end to end on the conversations' own last messages, 4. long outputs
        def caches(tags, settings=settings, alloc=alloc):
            return method_caches(model.config, settings, alloc, tags)

        e2e = [
            measure_sequence(model, torch.tensor([ids]), start, caches(tags), chunk)
            for (ids, tags, _), start in tqdm(
                list(zip(evaluation, starts, strict=True)), desc=f"end to end @ {budget}", unit="conversation"
            )
        ]
        for m in settings:
            for metric in METRICS:
                if metric in e2e[0][m]:
                    rows[m]["e2e_" + metric] = _mean(x for p in e2e for x in p[m][metric])
        # each conversation's own means: the units a verdict is tested over
        per_conversation = {
            m: {"attention_kl": per[m]["attention_kl"], "e2e_kl": [_mean(p[m]["kl"]) for p in e2e]}
            for m in settings
            if m != "FP16"
        }
        long = [
            measure_sequence(model, ids, prompt_len, caches(tags), chunk)
            for (ids, prompt_len), tags in tqdm(
                list(zip(long_seqs, long_tags, strict=True)), desc=f"long outputs @ {budget}", unit="conversation"
            )
        ]
        curves = {}
        if long:
            n = min(len(p["FP16"]["nll"]) for p in long)
            for m in settings:
                curves[m] = {
                    metric: [
                        statistics.fmean(col)
                        for col in zip(*(binned(p[m][metric][:n], bins) for p in long), strict=True)
                    ]
                    for metric in METRICS
                    if metric in long[0][m]
                }
        low_share = {m: rows[m]["low_share"] for m in TOKEN_METHODS}
        results.append(
            {
                "budget": budget,
                "methods": rows,
                "long_output": curves,
                "long_positions": min((len(p["FP16"]["nll"]) for p in long), default=0),
                "per_conversation": per_conversation,
                "memory": memory_rows(settings, low_share, budget_gib),
            }
        )
    return {
        "match": match,
        "budgets": list(budgets),
        "layers": layers,
        "head_dim": d,
        "kv_heads": kv_heads,
        "pair_layout": pair_layout,
        "calibration": {n: {**c, "allocations": allocated[n]} for n, c in calibrations.items()},
        "conversations": {
            "calibration": [r["id"] for r in calibration_rows],
            "evaluation": [r["id"] for r in evaluation_rows],
            "evaluation_tokens": [len(ids) for ids, _, _ in evaluation],
            "evaluated_positions": [len(ids) - s for (ids, _, _), s in zip(evaluation, starts, strict=True)],
        },
        "long_output_tokens": [ids.shape[1] - p for ids, p in long_seqs],
        "chunk": chunk,
        "bins": bins,
        "results": results,
        "claims": claims(results),
    }


# -- what it shows --------------------------------------------------------------------------------


def claims(results: list[dict], conversations: int | None = None) -> list[dict]:
    """TriAxialKV's stated trade-offs and the question of the comparison, judged on these numbers (`conversations`:
    how many evaluation conversations they came from, said where a result keeps no per-conversation values)."""
    out = []
    floor = TokenPrecisionConfig()
    lowest = floor.low_bits + 2 * 16 / floor.group_size
    out.append(
        {
            "claim": "INT2/INT4 only (TriAxialKV's stated limitation)",
            "holds": True,
            "source": "computed from the storage formula",
            "evidence": f"with G = {floor.group_size} and float16 scales and zeros an INT2 token costs {lowest:g} "
            "bits per element: no budget below that is reachable, where PN-Mix's paper setting costs "
            f"{channel_bits(pnmix(), 64):.3f} (d = 64)",
        }
    )
    for name in TOKEN_METHODS:
        over = [(r["budget"], r["methods"][name]["bits"], r["methods"][name]["stored_bits"]) for r in results]
        out.append(
            {
                "claim": f"{name}: the calibrated budget holds on other conversations (per-workload calibration)",
                "holds": all(s <= b + 0.05 for b, _, s in over),
                "source": "measured here",
                "evidence": "; ".join(
                    f"budget {b}: allocated {a:.3f} on calibration, stored {s:.3f} on evaluation" for b, a, s in over
                ),
            }
        )
    for metric, label in COMBINATION_METRICS:
        for r in results:
            m = r["methods"]
            if metric not in m["PN-Mix"]:
                continue
            vals = {n: m[n][metric] for n in METHODS if n != "FP16" and metric in m[n]}
            best = min(vals, key=vals.get)
            evidence = "mean over conversations: " + ", ".join(f"{n} {v:.4g}" for n, v in vals.items())
            holds, tested = beats(r.get("per_conversation"), metric, conversations)
            out.append(
                {
                    "claim": combination_claim(r["budget"], label),
                    "holds": holds,
                    "source": "measured here",
                    "evidence": f"{evidence}; lowest mean: {best}; {tested}",
                }
            )
    return out


#: The metrics the combination is compared on, as its claims name them.
COMBINATION_METRICS = (("attention_kl", "attention KL"), ("e2e_kl", "next-token KL (end to end)"))


def combination_claim(budget: float, label: str) -> str:
    return f"at {budget} bits, the combination beats both PN-Mix and TriAxialKV in {label}"


def written_on_means(results: list[dict]) -> dict[str, bool]:
    """The combination claims as results written before per-conversation values decided them, on the means (the
    combination's mean below both rivals'): what such a file says, checked as it was written; the report judges
    them inconclusive (`beats`)."""
    out = {}
    for metric, label in COMBINATION_METRICS:
        for r in results:
            m = r["methods"]
            if "per_conversation" not in r and metric in m["PN-Mix"]:
                combination = m[COMBINATION][metric]
                out[combination_claim(r["budget"], label)] = all(combination < m[rival][metric] for rival in RIVALS)
    return out


#: The method whose claim `beats` tests, and the methods it must beat.
COMBINATION, RIVALS = "role-aware PN-Mix", ("PN-Mix", "TriAxialKV")
#: A sign test over conversations decides at this two-sided p.
ALPHA = 0.05
#: A verdict the conversations cannot decide ("inconclusive" in the report).
UNDECIDED = "undecided"
#: Each verdict as the tool's markdown says it.
VERDICT = {True: "holds", False: "does not hold", UNDECIDED: "undecided"}


def beats(per_conversation: dict | None, metric: str, conversations: int | None = None) -> tuple[bool | str, str]:
    """Whether the combination's `metric` is below each rival's, conversation by conversation (a mean over a few
    conversations can hide that they disagree): a two-sided sign test per rival; True where both favour the
    combination at p < ALPHA, False where one favours the rival, UNDECIDED otherwise, and what was tested. A
    result of older code keeps no per-conversation values: UNDECIDED, said so, with what its `conversations`
    could have decided."""
    if not per_conversation:
        said = "the result keeps no per-conversation values: the means alone decide nothing"
        return UNDECIDED, said + (resolution(conversations, "conversations", ALPHA) if conversations else "")
    mine = per_conversation[COMBINATION][metric]
    tests = []
    for rival in RIVALS:
        theirs = per_conversation[rival][metric]
        pairs = list(zip(mine, theirs, strict=True))
        below, above = sum(a < b for a, b in pairs), sum(a > b for a, b in pairs)
        tests.append((rival, below, above, sign_test(below, above)))
    said = "; ".join(f"below {r} on {b} of {len(mine)} conversations (sign test p {p:.2g})" for r, b, _, p in tests)
    if any(above > below and p < ALPHA for _, below, above, p in tests):
        return False, said
    if all(below > above and p < ALPHA for _, below, above, p in tests):
        return True, said
    return UNDECIDED, said + resolution(len(mine), "conversations", ALPHA)


def _long_kl(r: dict, method: str) -> float | None:
    curve = r["long_output"].get(method, {}).get("kl")
    return statistics.fmean(curve) if curve else None


def findings(result: dict) -> list[str]:
    """What the numbers show, stated from them: the axis alone (role-aware PN-Mix against TriAxialKV,
    the same bits), the combination against PN-Mix, the lowest error at each budget, and how much more
    the channel methods store on these conversations."""

    def change(a: float, b: float) -> str:
        return f"{(1 - a / b) * 100:.0f}% lower" if a < b else f"{(a / b - 1) * 100:.0f}% higher"

    out = []
    for r in result["results"]:
        m = r["methods"]
        tri, combo, pn = m["TriAxialKV"], m["role-aware PN-Mix"], m["PN-Mix"]
        parts = [
            f"attention KL {change(combo['attention_kl'], tri['attention_kl'])}",
            f"next-token KL {change(combo['e2e_kl'], tri['e2e_kl'])}",
        ]
        if _long_kl(r, "TriAxialKV"):
            parts.append(f"long-output KL {change(_long_kl(r, 'role-aware PN-Mix'), _long_kl(r, 'TriAxialKV'))}")
        quantized = [n for n in m if n != "FP16"]
        best = {k: min(quantized, key=lambda n, k=k: m[n][k]) for k in ("attention_kl", "e2e_kl")}
        extra = [m[n]["stored_bits"] - tri["stored_bits"] for n in CHANNEL_METHODS]
        out.append(
            f"At {r['budget']} bits: role-aware PN-Mix against TriAxialKV (the same bits; what PN-Mix's pairs add "
            "to token roles): "
            + ", ".join(parts)
            + f". Against PN-Mix: attention KL {change(combo['attention_kl'], pn['attention_kl'])}, next-token KL "
            f"{change(combo['e2e_kl'], pn['e2e_kl'])}. Lowest attention KL: {best['attention_kl']}; lowest "
            f"next-token KL: {best['e2e_kl']}. On these conversations the channel methods store {min(extra):+.2f} "
            f"to {max(extra):+.2f} bits per element against TriAxialKV (exact residual and sinks included)."
        )
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


#: The columns of a budget's tables (`tables`).
METHOD_COLUMNS = ("method", "config", "bits", "stored", "attn KL", "out MSE", "e2e KL", "top-1", "NLL")
QUARTER_COLUMNS = ("method", "Q1", "Q2", "Q3", "Q4")
MEMORY_COLUMNS = ("method", "Fig. 6a: longest gen. at B=32", "Fig. 6b: max B at 8K", "cache GiB at B=32, 8K")


def tables(r: dict) -> dict[str, list[list[str]]]:
    """The rows of one budget's tables, the tool's markdown and the report's alike: "methods" (METHOD_COLUMNS),
    "long_output" (QUARTER_COLUMNS: KL(FP16 || method) by quarter of the output; empty where the run has no long
    outputs) and "memory" (MEMORY_COLUMNS)."""
    return {
        "methods": [
            [
                n,
                m["config"],
                f"{m['bits']:.3f}",
                f"{m['stored_bits']:.3f}",
                f"{m['attention_kl']:.3g}",
                f"{m['output_mse']:.3g}",
                _fmt(m.get("e2e_kl"), ".3g"),
                _fmt(m.get("e2e_top1"), ".3f"),
                f"{m['e2e_nll']:.4g}",
            ]
            for n, m in r["methods"].items()
        ],
        "long_output": [
            [n, *(f"{x:.3g}" for x in quarter_means(c["kl"]))] for n, c in r["long_output"].items() if "kl" in c
        ],
        "memory": [
            [x["method"], x["fig6a_longest_generation"], x["fig6b_max_batch"], f"{x['cache_gib_at_b32_8k']:.2f}"]
            for x in r["memory"]
        ],
    }


def markdown(result: dict) -> str:
    lines = [
        f"# Channels or token roles, at equal bits: {result['model']}\n",
        f"Measured on {result['device']}, {result['date_utc']}, `{result['command']}`. Calibration on "
        f"{len(result['conversations']['calibration'])} conversations, evaluation on "
        f"{len(result['conversations']['evaluation'])} ({result['conversations']['evaluation_tokens']} tokens); "
        f"attention at layers {result['layers']}. Bits: average key + value bits per element, scales, zeros, "
        "sinks and metadata counted (see the tool's doc); 'stored' counts everything held for the evaluated "
        f"sequences, exact residual included. Channel methods matched on "
        f"{'stored' if result.get('match') == 'stored' else 'bits'}.\n",
    ]
    for r in result["results"]:
        rows = tables(r)
        lines += [f"## Budget {r['budget']} bits\n", tabulate(rows["methods"], METHOD_COLUMNS, tablefmt="github"), ""]
        if rows["long_output"]:
            lines += [
                f"Long outputs ({r['long_positions']} positions): KL(FP16 || method) by quarter of the output\n",
                tabulate(rows["long_output"], QUARTER_COLUMNS, tablefmt="github"),
                "",
            ]
        lines += [
            "Memory (computed from each storage model; Qwen3-8B, A100-40GB budget, prompt 141)\n",
            tabulate(rows["memory"], MEMORY_COLUMNS, tablefmt="github"),
            "",
        ]
    lines += ["## What it shows\n", *(f"- {x}" for x in findings(result)), ""]
    lines += [
        "## Claims\n",
        tabulate(
            [
                [c["claim"], VERDICT[c["holds"]], c["source"], c["evidence"]]
                for c in claims(result["results"], len(result["conversations"]["evaluation"]))
            ],
            ["claim", "verdict", "source", "evidence"],
            tablefmt="github",
        ),
        "",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pnmix-equal-bits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a .gguf file, a model folder or a model package")
    parser.add_argument(
        "--budgets", type=float, nargs="+", default=list(DEFAULT_BUDGETS), help="average key + value bits per element"
    )
    parser.add_argument(
        "--layers",
        type=positive_int,
        default=5,
        help="layers captured, spread across depth (of those a method's cache quantizes)",
    )
    parser.add_argument(
        "--long-tokens", type=preflight.non_negative_int, default=512, help="greedy tokens per long output (0: none)"
    )
    parser.add_argument("--chunk", type=positive_int, default=128, help="tokens per teacher-forced forward")
    parser.add_argument("--bins", type=positive_int, default=8, help="spans of output positions in the curves")
    parser.add_argument(
        "--match",
        choices=MATCHES,
        default="asymptotic",
        help="match the channel methods' bits without their exact residual (the papers' count) or as "
        "stored for the evaluated conversations (equal memory on this workload)",
    )
    parser.add_argument("--smoke", action="store_true", help="one budget, two conversations each, 32 long tokens")
    parser.add_argument("--out", default="benchmarks/results")
    add_options(parser, plain=False)  # the tags are read from the template's markers: no plain prompts
    args = parser.parse_args(argv)
    for budget in args.budgets:
        if not (3.0 <= budget < float("inf")):
            parser.error(f"--budgets must be finite and at least 3.0 (TriAxialKV's INT2 floor), got {budget}")
    fmt = preflight.chat_format(parser, args)
    source = preflight.model(parser, args.model, preflight.ROLES, fmt)
    out_dir = preflight.output_folder(parser, args.out)
    from pnmix.hf import detect_pair_layout  # deferred: transformers takes seconds to import

    cal_rows, eval_rows = conversations.load("calibration"), conversations.load("evaluation")
    budgets, long_tokens = args.budgets, args.long_tokens
    if args.smoke:
        cal_rows, eval_rows = cal_rows.select(range(2)), eval_rows.select(range(2))
        budgets, long_tokens = budgets[:1], min(long_tokens, 32)
    model, tokenizer = source.load("sdpa")
    fmt.apply(tokenizer)
    layout = detect_pair_layout(model.config)
    if layout is None:
        parser.error(f"cannot tell the RoPE pair layout of {source.name}")
    started = time.monotonic()
    out = run(
        model,
        tokenizer,
        cal_rows,
        eval_rows,
        budgets=budgets,
        layers=cache_layers(model.config, args.layers),
        long_tokens=long_tokens,
        chunk=args.chunk,
        bins=args.bins,
        pair_layout=layout,
        match=args.match,
    )
    given = {
        "model": args.model,
        "layers": args.layers,
        "long-tokens": args.long_tokens,
        "chunk": args.chunk,
        "bins": args.bins,
        "match": args.match,
    }
    options = "".join(f" --{k} {v}" for k, v in given.items() if str(v) != str(parser.get_default(k.replace("-", "_"))))
    if list(args.budgets) != list(DEFAULT_BUDGETS):
        options += " --budgets " + " ".join(f"{b:g}" for b in args.budgets)
    options += fmt.options() + (" --smoke" if args.smoke else "")
    result = record(
        "equal-bits",
        model.device,
        command="pnmix-equal-bits" + options,
        model=source.describe(),
        model_fingerprint=source.fingerprint,
        chat_template=fmt.describe(),
        seconds=round(time.monotonic() - started, 1),
        behaviour=canaries.record(
            [n for design in METHODS for n in methods.names(design=design)],
            PIPELINE,
            model_fingerprint=source.fingerprint,
            data=[conversations.DATA],
        ),
        **out,
    )
    write_result(parser.prog, out_dir, KIND, result)
    return 0


#: Long enough that each candidate's pages (G up to 128, 32 sinks) quantize.
CANARY_TOKENS = 224


@torch.no_grad()
def canary() -> dict:
    """The equal-bits pipeline's canary (`benchmarks.canaries.behaviour`): each channel design matched to its
    budgets and what its cache gives back (`matched`, `stored_kv`, `attention_errors`) on the seeded workload."""
    q, k, v = workloads.qkv(seed=8, tokens=CANARY_TOKENS)
    q = q[:, : k.shape[1]]  # one query head per key head
    head_dim = k.shape[-1]
    chosen, numbers = [], {"bits": [], "attention kl": [], "output mse": []}
    for design in CHANNEL_METHODS:
        for budget in DEFAULT_BUDGETS:
            config, bits = matched(design, budget, head_dim, "split")
            chosen.append(describe(config))
            k_hat, v_hat = stored_kv(design, config, q, k, v, None)
            kl, mse = attention_errors(q, k, v, k_hat, v_hat, CANARY_TOKENS // 2, head_dim**-0.5)
            for key, value in zip(numbers, (bits, kl, mse), strict=True):
                numbers[key].append(value)
    return outcome({"configurations": chosen}, numbers)


#: The pipelines an equal-bits result records (it runs the long-output and role-calibration code too), with
#: their canaries.
PIPELINE = {"equal-bits": canary, **long_output.PIPELINE, **role_calibration.PIPELINE}


_METHOD = {
    "bits": schema.BITS,
    "config": str,
    "stored_bits": schema.BITS,
    "attention_kl": schema.DIVERGENCE,
    "output_mse": schema.NONNEGATIVE,
    "e2e_kl?": schema.DIVERGENCE,
    "e2e_top1?": schema.FRACTION,
    "e2e_nll": schema.NONNEGATIVE,
    "low_share?": schema.FRACTION,
}
#: The methods `findings` compares (and divides by the KL of TriAxialKV and PN-Mix).
_COMPARED = {**_METHOD, "e2e_kl": schema.DIVERGENCE}
_DIVISOR = {**_COMPARED, "attention_kl": schema.Range(0, above=True), "e2e_kl": schema.Range(0, above=True)}
_PER_CONVERSATION = schema.ListOf(schema.DIVERGENCE, nonempty=True)
#: What an equal-bits result holds, as its readers read it (`markdown`, `findings`, `claims`, the report).
SCHEMA = {
    **schema.MEASUREMENT,
    "layers": schema.ListOf(schema.LAYER, nonempty=True),
    "conversations": {
        "calibration": schema.ListOf(str),
        "evaluation": schema.ListOf(str),
        "evaluation_tokens": schema.ListOf(schema.COUNT),
    },
    "results": schema.ListOf(
        {
            "budget": schema.BITS,
            "methods": {
                "TriAxialKV": _DIVISOR,
                "PN-Mix": _DIVISOR,
                "role-aware PN-Mix": _COMPARED,
                "KIVI": _COMPARED,
                "Kitty": _COMPARED,
                "*": _METHOD,
            },
            "long_output": {"*": long_output.curves_schema()},
            "long_positions": schema.POSITIVE_COUNT,
            # each conversation's own means per method (results of older code lack them: `beats`)
            "per_conversation?": {"*": {"attention_kl": _PER_CONVERSATION, "e2e_kl": _PER_CONVERSATION}},
            "memory": schema.ListOf(
                {
                    "method": str,
                    "fig6a_longest_generation": schema.Maybe(schema.COUNT),
                    "fig6b_max_batch": schema.Range(0, schema.MAX_BATCH, integer=True),
                    "cache_gib_at_b32_8k": schema.GIB,
                }
            ),
        },
        nonempty=True,
    ),
    "claims": schema.ListOf(
        {"claim": str, "holds": schema.OneOf((True, False, UNDECIDED)), "source": str, "evidence": str}
    ),
}


def consistent(data: dict) -> list[tuple[str, str]]:
    """The memory of FP16 and TriAxialKV at every budget (the concurrency claim divides one by the other)."""
    out = []
    for i, r in enumerate(data["results"]):
        batch = {m["method"]: m["fig6b_max_batch"] for m in r["memory"]}
        if batch.get("FP16", 0) < 1 or "TriAxialKV" not in batch:
            out.append((f"results[{i}].memory", "lacks FP16 (with a largest batch of at least 1) or TriAxialKV"))
    return out


def recomputed(data: dict) -> list[str]:
    """The result's verdicts (`claims`: each claim and whether it holds) against `claims` of its own results."""
    try:
        again = {c["claim"]: c["holds"] for c in claims(data["results"])} | written_on_means(data["results"])
    except schema.UNCOMPUTABLE as err:
        return [f"claims: cannot be recomputed from its results ({schema.why(err)})"]
    given = {c["claim"]: c["holds"] for c in data["claims"]}
    said = {h: f"{'is' if h == UNDECIDED else ''} {v}".strip() for h, v in VERDICT.items()}
    out = [f"claims lacks {c!r} ({said[h]} on its results)" for c, h in again.items() if c not in given]
    for claim, holds in given.items():
        if claim not in again:
            out.append(f"claims has {claim!r}, which its results do not give")
        elif holds != again[claim]:
            out.append(f"claims says {claim!r} {said[holds]}; its results say it {said[again[claim]]}")
    return out


#: An equal-bits result: its schema, its markdown, its canaries and the checks of its memory and verdicts.
KIND = schema.Kind(
    "equal-bits", SCHEMA, render=markdown, pipeline=PIPELINE, consistent=consistent, recomputed=recomputed
)


if __name__ == "__main__":
    raise SystemExit(main())
