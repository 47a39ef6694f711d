"""The paper's fidelity analyses re-measured on a real model: SmolLM2-135M-Instruct (GGUF) by default.

    pnmix-fidelity [--smoke] [--new-tokens N] [--out DIR] [--model GGUF|FOLDER|PACKAGE]
                                  [--chat-template FILE | --plain-prompts]

Post-RoPE queries and keys of every layer and KV head are recorded during prefill and greedy
generation of the prompts in benchmarks/data/prompts.jsonl (loaded with `datasets`). Then:
- Fig. 5: share of the decode-time importance sum_t sum_{s<=t} ||q_t,i|| ||k_s,i|| held by the
  top 10/30/50% pairs (median over layers, KV heads, prompts);
- Fig. 4: Jaccard similarity of each criterion's top r% pairs (prefill-only and full sequence)
  with the top r% pairs by ||q_t,i|| * ||k_s,i|| of each decode query-key pair (t, s) and query
  head (the paper's ground truth), r = 10% and 50%, averaged over (t, s), heads, layers and
  prompts; every (t, s) up to FIG4_MAX_PAIRS per layer, a seeded sample beyond. The Jaccard with
  one ground truth per KV head summed over all (t, s) is kept as a labelled extra;
- Table 9: key MSE and attention KL divergence (decode queries) of uniform 2-bit keys
  (KIVI-style), PolarQuant-style 2-bit, and H3(50%)L1 with each criterion, prefill or full;
  keys only (values are not involved), all in the online cache's token layout at the end of the
  trace: 32 exact sinks, whole pages of N = 128 quantized in groups of G = 128, the newest
  (T - 32) mod 128 exact (residual). Built by the spec: `reference.ReferenceCache` (prefill of
  the prompt, generated keys appended) for uniform keys and the prefill selections,
  `reference.equations.quant.quantize_keys` with the offline full-sequence masks, `reference.equations.polar`;
  attention from the oracle's scores (`reference.equations.attention.attention_logits_ref`);
- Table 11: overlap of the prefill selection (r = 50%) with the decode-time salient pairs in
  four consecutive decode ranges, keys restricted to decode-generated ones, against the pair
  norm and |<q_i, k_i>| references; and, through the same code, the overlap of a seeded random
  selection of the same size (the chance level, measured);
- end to end: greedy outputs of each method (default bits) against FP16, and the negative
  log-likelihood of benchmarks/data/heldout.txt decoded token by token through each cache, with
  the number of tokens computed while the cache held quantized pages (a warning where it is
  under half: before the first flush a cache is exact).
`DEFINITIONS` states each analysis as computed here next to the paper's wording and what the
paper leaves open; the results carry it.
Results: JSON (with model, prompts, token counts, versions) and a markdown summary, written
atomically to new files. The paper's claims are restated next to what was measured here.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics

import torch
from tqdm import tqdm

from benchmarks.canaries import behaviour as canaries
from benchmarks.canaries import pipelines, workloads
from benchmarks.canaries.outcome import outcome
from benchmarks.commands import preflight
from benchmarks.commands.saving import write_result
from benchmarks.fidelity.claims import DEFINITIONS, markdown
from benchmarks.fidelity.trace import DATA, LAYOUT, TRACE, chat_ids, collect, register_tracer
from benchmarks.models.chat_format import MODEL_TEMPLATE, ChatFormat, add_options
from benchmarks.models.source import DEFAULT as DEFAULT_MODEL
from reference import PNMixConfig, ReferenceCache, methods, paper, prefill_pair_mask, schema, token_layout
from reference.cli import positive_int
from reference.equations import quant
from reference.equations.attention import attention_logits_ref
from reference.equations.polar import polar_dequantize, polar_quantize
from reference.equations.saliency import (
    CRITERIA,
    channel_mask_from_pairs,
    criterion_scores,
    pair_channels,
    pair_norms,
    select_salient_pairs,
)
from reference.methods import METHODS
from reference.records import record


def decode_importance(q: torch.Tensor, k: torch.Tensor, start: int, layout: str, key_from: int = 0) -> torch.Tensor:
    """sum over decode queries t >= start and keys key_from <= s <= t of ||q_t,i|| ||k_s,i||, per
    KV head (query heads summed over their group): [H_kv, d/2]. Pair i is `pair_channels(d, layout)`'s."""
    n_kv = k.shape[0]
    qn = pair_norms(q[:, start:], layout)  # [H, Td, d/2]
    kn = pair_norms(k, layout)
    kn = torch.where(torch.arange(k.shape[1])[None, :, None] >= key_from, kn, 0.0)
    kc = torch.cumsum(kn, 1)[:, start:]  # keys s <= t for each decode t
    qg = qn.view(n_kv, -1, *qn.shape[1:]).sum(1)
    return (qg * kc).sum(1)


def dot_importance(q: torch.Tensor, k: torch.Tensor, t0: int, t1: int, key_from: int, layout: str) -> torch.Tensor:
    """sum over t in [t0, t1) and key_from <= s <= t of |<q_t,i, k_s,i>| per KV head: [H_kv, d/2],
    the 2-channel dot product over the channels `pair_channels(d, layout)` gives pair i."""
    d = q.shape[-1]
    n_kv = k.shape[0]
    qh = q[:, t0:t1].view(n_kv, -1, t1 - t0, d)
    ks = k[:, key_from:t1]
    first, second = pair_channels(d, layout)
    prod = qh.unsqueeze(-2) * ks[:, None, None]  # [H_kv, rep, Tr, S, d]
    pair = (prod[..., first] + prod[..., second]).abs()
    s_idx = torch.arange(key_from, t1)[None, :]
    t_idx = torch.arange(t0, t1)[:, None]
    causal = (s_idx <= t_idx).float()[None, None, :, :, None]
    return (pair * causal).sum((1, 2, 3))


def top(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """The top floor(ratio * P) of each [..., P] row as a bool mask (ties to the lower pair index)."""
    return select_salient_pairs(scores, math.floor(ratio * scores.shape[-1] + 1e-9))


def jaccard(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a & b).sum(-1).float() / (a | b).sum(-1).clamp(min=1).float()


#: Most (t, s) pairs Fig. 4 visits exactly per layer and prompt; past it, a seeded random sample of this size.
FIG4_MAX_PAIRS = 65536


def decode_pairs(start: int, length: int, max_pairs: int = FIG4_MAX_PAIRS, seed: int = 0):
    """The (t, s) of Fig. 4: every decode query t in [start, length) with every key s <= t, as two
    long tensors, or, if there are more than max_pairs, max_pairs drawn uniformly with replacement
    (torch.Generator seeded with `seed`: t with probability (t + 1) / total, then s uniform in
    0..t). Returns (t, s, exact)."""
    ts = torch.arange(start, length)
    total = int((ts + 1).sum())
    if total <= max_pairs:
        t = torch.repeat_interleave(ts, ts + 1)
        s = torch.cat([torch.arange(int(x) + 1) for x in ts]) if len(ts) else torch.zeros(0, dtype=torch.long)
        return t, s, True
    gen = torch.Generator().manual_seed(seed)
    t = ts[torch.multinomial((ts + 1).double(), max_pairs, replacement=True, generator=gen)]
    s = (torch.rand(max_pairs, generator=gen, dtype=torch.float64) * (t + 1)).long()
    return t, s, False


def per_pair_jaccard(
    q: torch.Tensor,
    k: torch.Tensor,
    t: torch.Tensor,
    s: torch.Tensor,
    selections: torch.Tensor,
    ratio: float,
    layout: str,
) -> torch.Tensor:
    """Fig. 4 as the paper defines it: for each query head h and query-key pair (t, s), the Jaccard
    similarity of a selection with the top-r% pairs by ||q[h, t, i]|| * ||k[g(h), s, i]||, averaged
    over the (t, s) given. q: [H, T, d], k: [H_kv, T, d]; t, s: the pairs (see `decode_pairs`);
    selections: bool [C, H_kv, d/2], C selections chosen per KV head (a GQA group shares its KV
    head's selection, while each query head has its own ground truth). Returns [C, H]."""
    n_heads, n_kv = q.shape[0], k.shape[0]
    qn, kn = pair_norms(q, layout), pair_norms(k, layout)  # [H, T, P], [H_kv, T, P]
    kv_of = torch.arange(n_heads) // (n_heads // n_kv)  # repeat_kv order
    out = torch.zeros(selections.shape[0], n_heads)
    for h in range(n_heads):
        truth = top(qn[h, t] * kn[kv_of[h], s], ratio)  # [N, P]
        out[:, h] = jaccard(truth[None], selections[:, kv_of[h], None]).mean(-1)
    return out


def quantized_region(k: torch.Tensor, config: PNMixConfig, quantize) -> torch.Tensor:
    """Keys [H_kv, T, d] with the tokens that `token_layout(config, T)` puts in the quantized region
    replaced by `quantize(region)` (region [1, H_kv, T_q, d] -> float32, same shape); sinks and
    residual exact, as the online cache holds them."""
    tokens = token_layout(config, k.shape[1])
    n_sink, n_q = tokens.n_sink, tokens.n_quantized
    out = k.clone()
    if n_q:
        out[:, n_sink : n_sink + n_q] = quantize(k[None, :, n_sink : n_sink + n_q])[0]
    return out


def cache_keys(q: torch.Tensor, k: torch.Tensor, prompt_len: int, config: PNMixConfig) -> torch.Tensor:
    """Keys [H_kv, T, d] as the spec's online cache gives them back after the whole trace.

    `reference.ReferenceCache.from_prefill` on the prompt (q [H, :prompt_len], k [H_kv, :prompt_len]),
    the generated keys appended, then `dequantize()`. The cache decides everything: which tokens are
    sinks, quantized or residual (`token_layout`, by length alone, so appending the generated keys in
    one call equals appending them one per step) and which channels get b_high bits (config.criterion
    over the prompt, once, for PN-Mix; none for uniform keys; per page of G keys from that page's own
    keys for Kitty). Values take no part: zeros, kept unquantized.
    """
    cfg = dataclasses.replace(config, value_bits=16)
    v = torch.zeros_like(k)[None]
    cache = ReferenceCache.from_prefill(q[None, :, :prompt_len], k[None, :, :prompt_len], v[:, :, :prompt_len], cfg)
    if k.shape[1] > prompt_len:
        cache.append(k[None, :, prompt_len:], v[:, :, prompt_len:])
    return cache.dequantize()[0][0]


def masked_keys(k: torch.Tensor, config: PNMixConfig, channel_mask: torch.Tensor) -> torch.Tensor:
    """Keys [H_kv, T, d] in `cache_keys`'s token layout, with a channel mask chosen outside the cache:
    bool [H_kv, d] (or [H_kv, T_q / G, d], one per key group). The quantized region goes through the
    spec's `reference.equations.quant.quantize_keys` (Eq. 2, Eq. 7 at 1 bit) and
    `reference.equations.quant.dequantize`."""
    g, midpoint = config.group_size, config.one_bit == "midpoint"

    def quantize(region: torch.Tensor) -> torch.Tensor:
        codes = quant.quantize_keys(
            region, channel_mask[None], config.b_high, config.b_low, g, config.scale_dtype, midpoint
        )
        return quant.dequantize(codes, g, -2)

    return quantized_region(k, config, quantize)


def polar_keys(k: torch.Tensor, config: PNMixConfig) -> torch.Tensor:
    """Keys [H_kv, T, d] in `cache_keys`'s token layout, the quantized region through `reference.equations.polar`
    (config.b_low bits for the radius and for the angle of each pair of config.pair_layout)."""
    g, layout = config.group_size, config.pair_layout

    def quantize(region: torch.Tensor) -> torch.Tensor:
        return polar_dequantize(polar_quantize(region, config.b_low, g, layout, config.scale_dtype), g, layout)

    return quantized_region(k, config, quantize)


def table9_keys(q: torch.Tensor, k: torch.Tensor, prompt_len: int, base: PNMixConfig) -> dict[str, torch.Tensor]:
    """Table 9's keys [H_kv, T, d] of one layer by row name, all at about 2 bits and in one token
    layout: the online cache's at the end of the trace (`token_layout(base, T)`: the first n_sink
    tokens exact, then whole pages of N quantized per channel in groups of G, the newest
    (T - n_sink) mod N exact in the residual). q: [H, T, d], k: [H_kv, T, d], post-RoPE.

    - "KIVI-style uniform 2-bit": `cache_keys` with KIVI-2's configuration (no selection);
    - "PolarQuant-style 2-bit": `polar_keys` at 2 bits;
    - "H3(50%)L1, <criterion> (prefill)": `cache_keys` with `base` ranking by that criterion: the
      PN-Mix cache itself, pairs chosen once from the prompt;
    - "H3(50%)L1, <criterion> (full)": offline, the same selection rule
      (`reference.prefill_pair_mask`) over the whole trace, applied with `masked_keys`.
    base: H3(50%)L1 with the pages and pair layout to use.
    """
    layout = base.pair_layout
    sizes = {"group_size": base.group_size, "residual_length": base.residual_length, "n_sink": base.n_sink}
    uniform = METHODS["KIVI-2"](pair_layout=layout, scale_dtype=base.scale_dtype, **sizes)
    out = {
        "KIVI-style uniform 2-bit": cache_keys(q, k, prompt_len, uniform),
        "PolarQuant-style 2-bit": polar_keys(k, uniform),
    }
    for crit in CRITERIA:
        cfg = dataclasses.replace(base, criterion=crit)
        out[f"H3(50%)L1, {crit} (prefill)"] = cache_keys(q, k, prompt_len, cfg)
        full = prefill_pair_mask(q[None], k[None], cfg)[0]
        out[f"H3(50%)L1, {crit} (full)"] = masked_keys(k, cfg, channel_mask_from_pairs(full, layout))
    return out


def attention_kl(q: torch.Tensor, k: torch.Tensor, k_hat: torch.Tensor, start: int) -> float:
    """Mean KL(p || p_hat) over query heads and decode queries t >= start of the attention
    distributions over keys s <= t: exact keys k against k_hat. q: [H, T, d]; k, k_hat: [H_kv, T, d].

    Log-probabilities are log_softmax of the oracle's scores (`reference.equations.attention.attention_logits_ref`:
    causal, float32, scale 1/sqrt(d), query head h reads KV head h // (H / H_kv)).
    """
    qd = q[None, :, start:]
    logp, logp_hat = (
        torch.log_softmax(attention_logits_ref(qd, keys[None], causal=True), -1)[0] for keys in (k, k_hat)
    )
    visible = torch.isfinite(logp)
    kl = torch.where(visible, logp.exp() * (logp - logp_hat), 0.0).sum(-1)
    return float(kl.mean())


def analyse_prompt(traces, prompt_len: int, pages: dict, layout: str = LAYOUT, prompt: int = 0) -> dict:
    """Every trace analysis of one prompt (the `prompt`-th: the random control's draws differ per prompt and
    layer), as lists over (layer, KV head); RoPE pairs in `layout`."""
    base = PNMixConfig(pair_layout=layout, **pages)
    r = {
        "share": {10: [], 30: [], 50: []},
        "jaccard": {},
        "jaccard_aggregated": {},
        "fig4_pairs": [],
        "table9": {},
        "stability": {"pair-norm": {}, "dot": {}},
        "stability_random": {"pair-norm": {}, "dot": {}},
    }
    for q, k in traces:
        n_pairs = k.shape[-1] // 2
        total_len = k.shape[1]
        gt = decode_importance(q, k, prompt_len, layout)
        ordered = torch.sort(gt, -1, descending=True).values
        for pct in (10, 30, 50):
            n = math.floor(pct / 100 * n_pairs)
            r["share"][pct] += (ordered[:, :n].sum(-1) / ordered.sum(-1)).tolist()
        t, s, exact = decode_pairs(prompt_len, total_len, seed=len(r["fig4_pairs"]))
        r["fig4_pairs"].append({"pairs": len(t), "exact": exact})
        scopes = {"prefill": (q[:, :prompt_len], k[:, :prompt_len]), "full": (q, k)}
        names = [(crit, scope) for crit in CRITERIA for scope in scopes]
        scores = {(c, sc): criterion_scores(c, scopes[sc][0][None], scopes[sc][1][None], layout)[0] for c, sc in names}
        for ratio in (0.1, 0.5):
            chosen = torch.stack([top(scores[name], ratio) for name in names])  # [C, H_kv, P]
            per_head = per_pair_jaccard(q, k, t, s, chosen, ratio, layout)  # [C, H]
            aggregated = jaccard(chosen, top(gt, ratio)[None])  # [C, H_kv]
            for (crit, scope), paper_def, extra in zip(names, per_head, aggregated, strict=True):
                key = f"{crit} ({scope}), r={ratio:.0%}"
                r["jaccard"].setdefault(key, []).extend(paper_def.tolist())
                r["jaccard_aggregated"].setdefault(key, []).extend(extra.tolist())
        for name, k_hat in table9_keys(q, k, prompt_len, base).items():
            entry = r["table9"].setdefault(name, {"mse": [], "kl": []})
            entry["mse"].append(float(((k_hat - k) ** 2).mean()))
            entry["kl"].append(attention_kl(q, k, k_hat, prompt_len))
        prefill_sel = prefill_pair_mask(q[None, :, :prompt_len], k[None, :, :prompt_len], base)[0]  # PN-Mix's
        control = random_selection(prefill_sel, seed=CONTROL_LAYERS * prompt + len(r["fig4_pairs"]))
        tops = decode_tops(q, k, prompt_len, layout)  # once: the same references for both selections
        for name, selection in (("stability", prefill_sel), ("stability_random", control)):
            for ref, by_range in overlaps(tops, selection).items():
                for j, overlap in by_range.items():
                    r[name][ref].setdefault(j, []).extend(overlap)
    return r


#: Table 11's decode ranges: the generated tokens cut in this many consecutive spans.
TABLE11_RANGES = 4


def stability(
    q: torch.Tensor, k: torch.Tensor, prompt_len: int, selection: torch.Tensor, layout: str = LAYOUT
) -> dict[str, dict[int, list[float]]]:
    """Table 11: the share of a selection (a [H_kv, P] mask: PN-Mix's prefill selection, or a control) that is
    among the top 50% pairs of each decode range, per reference (the pair norm, |<q_i, k_i>|) and range, keys
    restricted to decode-generated ones; a list over KV heads per range."""
    return overlaps(decode_tops(q, k, prompt_len, layout), selection)


def decode_tops(q: torch.Tensor, k: torch.Tensor, prompt_len: int, layout: str = LAYOUT) -> dict:
    """Table 11's references: the top 50% pairs of each decode range ([H_kv, P] masks), by reference and range."""
    bounds = torch.linspace(prompt_len, k.shape[1], TABLE11_RANGES + 1).round().long().tolist()
    out: dict[str, dict[int, torch.Tensor]] = {"pair-norm": {}, "dot": {}}
    for j, (t0, t1) in enumerate(itertools.pairwise(bounds)):
        if t1 <= t0:
            continue
        out["pair-norm"][j] = top(decode_importance(q[:, :t1], k[:, :t1], t0, layout, key_from=prompt_len), 0.5)
        out["dot"][j] = top(dot_importance(q, k, t0, t1, prompt_len, layout), 0.5)
    return out


def overlaps(tops: dict, selection: torch.Tensor) -> dict[str, dict[int, list[float]]]:
    """The share of `selection` among each of `decode_tops`' masks: a list over KV heads per reference and range."""
    n = selection.sum(-1).clamp(min=1).float()
    return {
        ref: {j: ((selection & mask).sum(-1).float() / n).tolist() for j, mask in by_range.items()}
        for ref, by_range in tops.items()
    }


#: Added to the random control's seed, so that its draws share no seed with any other seeded draw.
CONTROL_STREAM = 0x7AB1E11
#: The random control's seed is CONTROL_LAYERS * prompt + layer: one draw per (prompt, layer) below this many layers.
CONTROL_LAYERS = 1024


def random_selection(selection: torch.Tensor, seed: int) -> torch.Tensor:
    """Table 11's control: as many pairs as `selection` picks in each row, drawn at random (seeded), so that the
    same code measures the overlap chance gives (r = 50%: 0.5 on average)."""
    g = torch.Generator().manual_seed(CONTROL_STREAM + seed)  # a stream of its own: no other draw's seed
    ranks = torch.rand(selection.shape, generator=g).argsort(-1).argsort(-1)
    return ranks < selection.sum(-1, keepdim=True)


#: Below this share of generated tokens computed with quantized pages, an end-to-end result is flagged.
MIN_QUANTIZED_TOKENS = 0.5


def quantized_reads(config: PNMixConfig, prompt_len: int, new_tokens: int) -> dict:
    """How much of a greedy generation read quantized pages: token 0 comes from the prefill's exact
    attention, token j >= 1 from a decode step over prompt_len + j cached keys, of which
    `token_layout(config, prompt_len + j).n_quantized` are quantized (none before the first flush)."""
    lengths = range(prompt_len + 1, prompt_len + new_tokens)
    quantized = [token_layout(config, n).n_quantized for n in lengths]
    return {
        "tokens": new_tokens,
        "tokens_with_quantized_pages": sum(n > 0 for n in quantized),
        "quantized_key_share": sum(quantized) / sum(lengths) if len(lengths) else 0.0,
    }


def quantization_warnings(e2e: dict) -> list[str]:
    """One line per method whose end-to-end run quantized too little to measure anything."""
    out = []
    for name, m in e2e["methods"].items():
        for what, reads in (("greedy tokens", m.get("quantized_reads", [])), ("held-out tokens", [m.get("nll_reads")])):
            for r in filter(None, reads):
                if r["tokens_with_quantized_pages"] < MIN_QUANTIZED_TOKENS * r["tokens"]:
                    out.append(
                        f"{name}: only {r['tokens_with_quantized_pages']} of {r['tokens']} {what} were computed with "
                        f"quantized pages in the cache ({r['quantized_key_share']:.1%} of the keys read); the "
                        "rest ran on an exact cache, so agreement there measures little"
                    )
    return out


@torch.no_grad()
def end_to_end(
    model,
    tokenizer,
    prompts,
    new_tokens: int,
    heldout: str,
    prefix: int,
    pages: dict,
    progress,
    layout: str = LAYOUT,
    fmt: ChatFormat = MODEL_TEMPLATE,
) -> dict:
    """Greedy agreement with FP16 and held-out NLL through each method's packed cache."""
    from pnmix.hf import PNMixHFCache, cache_argument  # deferred: transformers takes seconds to import

    names = methods.names(tag="fidelity")
    configs = {n: METHODS[n](pair_layout=layout, **pages) for n in names}
    out = {
        name: {"identical_fraction": [], "first_divergence": [], "quantized_reads": [], "nll": None, "nll_reads": None}
        for name in names
    }
    for prompt in progress(prompts, desc="end to end"):
        inputs = chat_ids(tokenizer, prompt, fmt)
        n0 = inputs["input_ids"].shape[1]
        model.set_attn_implementation("sdpa")
        ref = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)[0, n0:]
        model.set_attn_implementation("pnmix")
        for name in names:
            cache = PNMixHFCache(model.config, configs[name], backend="reference")
            got = model.generate(
                **inputs,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                **{cache_argument(model): cache},
            )[0, n0:]
            same = (got == ref).tolist()
            out[name]["identical_fraction"].append(sum(same) / len(same))
            out[name]["first_divergence"].append(same.index(False) if False in same else None)
            out[name]["quantized_reads"].append(quantized_reads(configs[name], n0, len(same)))
    ids = tokenizer(heldout, return_tensors="pt")["input_ids"]

    def nll(m, cache):
        logits = m(input_ids=ids[:, :prefix], use_cache=True, **{cache_argument(m): cache}).logits[:, -1]
        total = 0.0
        for t in range(prefix, ids.shape[1]):
            total -= float(torch.log_softmax(logits.float(), -1)[0, ids[0, t]])
            logits = m(input_ids=ids[:, t : t + 1], use_cache=True, **{cache_argument(m): cache}).logits[:, -1]
        return total / (ids.shape[1] - prefix)

    from transformers import DynamicCache

    model.set_attn_implementation("sdpa")
    fp16_nll = nll(model, DynamicCache())
    model.set_attn_implementation("pnmix")
    for name in progress(names, desc="held-out NLL"):
        out[name]["nll"] = nll(model, PNMixHFCache(model.config, configs[name], backend="reference"))
        out[name]["nll_reads"] = quantized_reads(configs[name], prefix, ids.shape[1] - prefix)
    model.set_attn_implementation(TRACE)
    e2e = {"methods": out, "fp16_nll": fp16_nll, "heldout_tokens": int(ids.shape[1]), "prefix": prefix}
    return e2e | {"warnings": quantization_warnings(e2e)}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


#: Table 11's summaries by the analysis each averages: PN-Mix's prefill selection, and the random control.
TABLE11_KEYS = {"table11_overlap_mean": "stability", "table11_random_overlap_mean": "stability_random"}


def summarize(per_prompt: list[dict]) -> dict:
    """Medians (Fig. 5, as the paper) and means (Fig. 4, Table 9, Table 11) over layers, KV heads, prompts."""

    def pool(get) -> list[float]:
        return [v for r in per_prompt for v in get(r)]

    first = per_prompt[0]
    return {
        "fig5_share_median": {pct: median(pool(lambda r, p=pct: r["share"][p])) for pct in (10, 30, 50)},
        "fig4_jaccard_mean": {k: statistics.fmean(pool(lambda r, k=k: r["jaccard"][k])) for k in first["jaccard"]},
        "fig4_aggregated_jaccard_mean": {
            k: statistics.fmean(pool(lambda r, k=k: r["jaccard_aggregated"][k])) for k in first["jaccard_aggregated"]
        },
        "fig4_pairs": {
            "per_layer_and_prompt": sorted({p["pairs"] for r in per_prompt for p in r["fig4_pairs"]}),
            "exact": all(p["exact"] for r in per_prompt for p in r["fig4_pairs"]),
            "max_pairs": FIG4_MAX_PAIRS,
        },
        "table9_mean": {
            name: {m: statistics.fmean(pool(lambda r, n=name, m=m: r["table9"][n][m])) for m in ("mse", "kl")}
            for name in first["table9"]
        },
        **{
            key: {
                ref: {
                    j: statistics.fmean(pool(lambda r, ref=ref, j=j, name=name: r[name][ref].get(j, [])))
                    for j in sorted(first[name][ref])
                }
                for ref in ("pair-norm", "dot")
            }
            for key, name in TABLE11_KEYS.items()
            if name in first
        },
    }


def prompt_summary(r: dict) -> dict:
    """One prompt's means and medians, as `summarize` gives them over every prompt (without the (t, s) counts):
    the unit a verdict across prompts tests."""
    s = summarize([r])
    keys = ("fig4_jaccard_mean", "fig5_share_median", "table9_mean", *TABLE11_KEYS)
    return {k: s[k] for k in keys if k in s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pnmix-fidelity", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="one prompt, few tokens: checks the harness")
    parser.add_argument(
        "--new-tokens", type=positive_int, default=None, help="generated tokens per prompt (default 200)"
    )
    parser.add_argument(
        "--e2e-prompts",
        type=preflight.non_negative_int,
        default=None,
        help="prompts for the end-to-end run (default 2; 0: none)",
    )
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a .gguf file, a transformers model folder, or an installed model package shipping one .gguf "
        f"(default {DEFAULT_MODEL}: SmolLM2-135M-Instruct); nothing is downloaded",
    )
    parser.add_argument(
        "--pair-layout",
        choices=("split", "adjacent"),
        help="the model's RoPE pairs, where they cannot be probed from its rotary function",
    )
    add_options(parser)
    args = parser.parse_args(argv)
    fmt = preflight.chat_format(parser, args)
    source = preflight.model(parser, args.model, preflight.CHAT, fmt)
    out = preflight.output_folder(parser, args.out)
    torch.manual_seed(args.seed)
    new_tokens = args.new_tokens or (24 if args.smoke else 200)
    e2e_prompts = args.e2e_prompts if args.e2e_prompts is not None else (1 if args.smoke else 2)
    import datasets

    prompts = datasets.load_dataset("json", data_files=str(DATA / "prompts.jsonl"), split="train")
    prompts = prompts.select(range(1)) if args.smoke else prompts
    # The paper's pages (G = N = 128, 32 sinks); the smoke run's short sequences need small ones.
    pages = {"group_size": 16, "residual_length": 16, "n_sink": 4} if args.smoke else {}
    register_tracer()
    model, tokenizer = source.load(TRACE)
    fmt.apply(tokenizer)
    from pnmix.hf import detect_pair_layout  # deferred: transformers takes seconds to import

    layout = args.pair_layout or detect_pair_layout(model.config)
    if layout is None:
        parser.error(f"cannot tell the RoPE pair layout of {source.name}: pass --pair-layout split or adjacent")
    per_prompt, prompt_tokens = [], 0
    for i, row in enumerate(tqdm(prompts, desc="trace and analyse", unit="prompt")):
        traces, prompt_len, _ = collect(model, tokenizer, row["prompt"], new_tokens, fmt)
        prompt_tokens += prompt_len
        per_prompt.append(analyse_prompt(traces, prompt_len, pages, layout, prompt=i))
    result = record(
        "fidelity",
        model.device,  # where the traces were taken and analysed
        command="pnmix-fidelity"
        + (" --smoke" if args.smoke else "")
        + ("" if args.model == DEFAULT_MODEL else f" --model {args.model}")
        + fmt.options(),
        model=source.describe(),
        model_fingerprint=source.fingerprint,
        chat_template=fmt.describe(),
        pair_layout=layout,
        seed=args.seed,
        prompt_set="benchmarks/data/prompts.jsonl",
        prompts=len(prompts),
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        pages=pages or {"group_size": 128, "residual_length": 128, "n_sink": 32},
        definitions=DEFINITIONS,
        summary=summarize(per_prompt),
        # each prompt's own means: what a verdict tests across prompts (`claims.claim_holds`)
        per_prompt=[prompt_summary(r) for r in per_prompt],
        behaviour=canaries.record(
            [methods.FP16, *methods.names(tag="fidelity")],
            PIPELINE,
            model_fingerprint=source.fingerprint,
            data=[DATA / "prompts.jsonl", DATA / "heldout.txt"],
        ),
    )
    if e2e_prompts:
        heldout = (DATA / "heldout.txt").read_text()
        result["end_to_end"] = end_to_end(
            model,
            tokenizer,
            [r["prompt"] for r in prompts.select(range(min(e2e_prompts, len(prompts))))],
            new_tokens,
            heldout[: 300 if args.smoke else None],
            16,
            pages,
            lambda it, desc: tqdm(it, desc=desc),
            layout,
            fmt,
        )
    write_result(parser.prog, out, KIND, result)
    return 0


@torch.no_grad()
def canary() -> dict:
    """The fidelity pipeline's canary (`benchmarks.canaries.behaviour`): the trace analyses of `analyse_prompt`
    (Table 9, Fig. 4, Fig. 5, Table 11) on seeded query and key traces."""
    q, k, _ = workloads.qkv(seed=7, tokens=workloads.PROMPT + workloads.APPENDS)
    traces = [(q[0], k[0])]  # one layer: q [H, T, d], k [H_kv, T, d]
    found = analyse_prompt(traces, workloads.PROMPT, {**workloads.PAGES, "n_sink": workloads.SINKS})
    # the random control (a seeded chance level, by the same `stability` as the selection's overlap counted
    # here) is left out: results written before it existed keep a canary that still reproduces
    found.pop("stability_random")
    numbers = pipelines.numbers(found)
    return outcome({"analyses": sorted(numbers)}, numbers)


#: The pipeline a fidelity result records, with its canary.
PIPELINE = {"fidelity": canary}


_TABLE9 = {"mse": schema.NONNEGATIVE, "kl": schema.DIVERGENCE}
#: What a fidelity result holds, as its readers read it (`claims.markdown`, `claims.verdicts`, the report).
SCHEMA = {
    **schema.MEASUREMENT,
    "prompts": schema.POSITIVE_COUNT,
    "prompt_tokens": schema.POSITIVE_COUNT,
    "new_tokens": schema.COUNT,
    "versions": dict,
    "summary": {
        # claims.verdicts reads every criterion of Fig. 4's order at both scopes and both r
        "fig4_jaccard_mean": {
            **{
                f"{c} ({scope}), r={r}": schema.FRACTION
                for c in CRITERIA
                for scope in ("prefill", "full")
                for r in ("10%", "50%")
            },
            "*": schema.FRACTION,
        },
        "fig4_aggregated_jaccard_mean?": {"*": schema.FRACTION},
        "fig4_pairs?": {
            "per_layer_and_prompt": schema.ListOf(schema.COUNT),
            "exact": bool,
            "max_pairs": schema.COUNT,
        },
        "fig5_share_median": {**{str(p): schema.FRACTION for p in paper.FIG5_TOP_PERCENT}, "*": schema.FRACTION},
        # the methods claims.verdicts names; the others are listed in the table
        "table9_mean": {
            "KIVI-style uniform 2-bit": _TABLE9,
            "PolarQuant-style 2-bit": _TABLE9,
            "H3(50%)L1, qk-pair-norm (prefill)": _TABLE9,
            "*": _TABLE9,
        },
        "table11_overlap_mean": {"*": {"*": schema.FRACTION}},
        "table11_random_overlap_mean?": {"*": {"*": schema.FRACTION}},
    },
    # each prompt's own means (results of older code lack them: their Fig. 4 and Table 11 cannot be decided)
    "per_prompt?": schema.ListOf(
        {
            "fig4_jaccard_mean": {"*": schema.FRACTION},
            "table11_overlap_mean": {"*": {"*": schema.FRACTION}},
            # the random control of the same size through the same code (results of older code lack it)
            "table11_random_overlap_mean?": {"*": {"*": schema.FRACTION}},
        },
        nonempty=True,
    ),
    "end_to_end?": {
        "methods": {
            "*": {
                "identical_fraction": schema.ListOf(schema.FRACTION, nonempty=True),
                "first_divergence": schema.ListOf(schema.Maybe(schema.COUNT)),
                "nll": schema.NONNEGATIVE,
                "quantized_reads?": schema.Maybe(
                    schema.ListOf({"tokens": schema.COUNT, "tokens_with_quantized_pages": schema.COUNT})
                ),
            }
        },
        "fp16_nll": schema.NONNEGATIVE,
        "heldout_tokens": schema.COUNT,
        "prefix": schema.COUNT,
        "warnings?": schema.ListOf(str),
    },
}
#: A fidelity result: its schema, its markdown and the canary of its pipeline. A fidelity result keeps no
#: per-prompt values: its summary is evidence as given.
KIND = schema.Kind("fidelity", SCHEMA, render=markdown, pipeline=PIPELINE)


if __name__ == "__main__":
    raise SystemExit(main())
