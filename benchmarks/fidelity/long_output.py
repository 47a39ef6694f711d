"""Fidelity over long outputs: how far each method's next-token distribution drifts from FP16 as
the output grows (the reason PN-Mix exists: errors that accumulate over 8K-32K generated tokens).

    pnmix-long-output [--model M] [--tokens 8192] [--prompts N] [--prompt-set FILE] [--chunk 256] [--smoke]
                                     [--chat-template FILE | --plain-prompts]

For each prompt of --prompt-set (default benchmarks/data/long_prompts.jsonl: 16 requests for long texts,
stories, essays, guides, lessons; all of them unless --prompts) the FP16 model generates `--tokens` tokens
greedily (up to its context); then every method reads that same sequence, teacher-forced, through
its packed cache (`pnmix.hf.PNMixHFCache`, reference backend), and at every generated position:
- KL(FP16 || method) of the next-token distributions (natural log),
- top-1 agreement (the method's most likely next token is FP16's),
- NLL of the token FP16 generated, under the method and under FP16.
Tokens go through the caches `--chunk` at a time with stepwise attention
(`reference.ReferenceCache.attend_stepwise`): each position attends exactly as it would in
token-by-token decoding (pnmix/tests/test_hf_models.py checks it), at one forward per chunk.
Methods run at the paper's pages (G = N = 128, 32 sinks) and default bits; the curves bin the
positions. Within a chunk the methods run one after the other, each method's logits freed before
the next runs (with a 262K-token vocabulary they are the largest thing held); the result records
the run's peak resident memory. Results: JSON and markdown (and a PNG of the curves) written
atomically to new files.
"""

from __future__ import annotations

import argparse
import itertools
import math
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate
from tqdm import tqdm

from benchmarks.accuracy.stats import resolution, sign_test
from benchmarks.canaries import behaviour as canaries
from benchmarks.canaries import pipelines, workloads
from benchmarks.canaries.outcome import outcome
from benchmarks.commands import preflight
from benchmarks.commands.heap import trimmed
from benchmarks.commands.saving import write_result
from benchmarks.models.chat_format import MODEL_TEMPLATE, ChatFormat, add_options
from benchmarks.models.source import DEFAULT as DEFAULT_MODEL
from reference import PNMixConfig, schema, token_layout
from reference.channels.storage import bit_widths
from reference.cli import non_negative_float, positive_int
from reference.methods import METHODS, names
from reference.methods import config as method_config
from reference.records import code_key, record

DATA = Path(__file__).parents[1] / "data"
#: The default prompts: requests for long texts (a sign test over prompts decides on 13 of 16 agreeing, where 8
#: prompts must all agree).
PROMPT_SET = DATA / "long_prompts.jsonl"
DEFAULT_METHODS = names(tag="fidelity")  # about 2.3 key bits each
METRICS = ("kl", "top1", "nll")


def _log_probs(model, ids: torch.Tensor, cache, attn: str, last_only: bool) -> torch.Tensor:
    """Next-token log-probabilities (float64) at each position of `ids` ([T, V]; the last only: [1, V])."""
    from pnmix.hf import cache_argument  # deferred: transformers takes seconds to import

    model.set_attn_implementation(attn)
    logits = model(input_ids=ids, **{cache_argument(model): cache}).logits[0]
    return torch.log_softmax((logits[-1:] if last_only else logits).double(), -1)


#: Positions whose KL is computed at once: bounds the float64 temporaries to a few vocabularies' worth.
KL_ROWS = 32


def _kl(ref: torch.Tensor, log_p: torch.Tensor) -> list[float]:
    """KL(ref || log_p) of each row of two [T, V] log-probability tensors, KL_ROWS rows at a time (a
    function: the row views, which keep their tensors alive, end with it)."""
    out = []
    for a in range(0, ref.shape[0], KL_ROWS):
        r, q = ref[a : a + KL_ROWS], log_p[a : a + KL_ROWS]
        out += (r.exp() * (r - q)).sum(-1).clamp_min(0).tolist()
    return out


@torch.no_grad()
def measure_sequence(model, ids: torch.Tensor, prompt_len: int, configs: dict, chunk: int) -> dict:
    """Per generated position p (the distribution of token p + 1 given tokens up to p), for each
    method: KL(FP16 || method), top-1 agreement and NLL; and FP16's own NLL. ids: [1, T]."""
    from transformers import DynamicCache

    from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import

    caches = {"FP16": DynamicCache()}  # a config, or a function that returns a cache (per-token precision)
    caches |= {
        n: c() if callable(c) else PNMixHFCache(model.config, c, backend="reference", stepwise=True)
        for n, c in configs.items()
    }
    out = {n: {m: [] for m in METRICS} for n in configs} | {"FP16": {"nll": []}}
    bounds = [(0, prompt_len)] + [
        (a, min(a + chunk, ids.shape[1] - 1)) for a in range(prompt_len, ids.shape[1] - 1, chunk)
    ]
    for first, last in bounds:
        prompt = first == 0  # the prompt: only its last position predicts a generated token
        targets = ids[0, prompt_len : prompt_len + 1] if prompt else ids[0, first + 1 : last + 1]
        ref = _log_probs(model, ids[:, first:last], caches["FP16"], "sdpa", prompt)
        out["FP16"]["nll"] += (-ref.gather(-1, targets[:, None])[:, 0]).tolist()
        for name in configs:  # one method's outputs at a time: each is freed before the next runs
            log_p = _log_probs(model, ids[:, first:last], caches[name], "pnmix", prompt)
            out[name]["kl"] += _kl(ref, log_p)
            out[name]["top1"] += (log_p.argmax(-1) == ref.argmax(-1)).double().tolist()
            out[name]["nll"] += (-log_p.gather(-1, targets[:, None])[:, 0]).tolist()
            del log_p
    return out


class _Progress:
    """A `generate` streamer that only counts decode steps (the first `put` is the prompt)."""

    def __init__(self, bar) -> None:
        self.bar, self.prompt_seen = bar, False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.bar.update(1)
        self.prompt_seen = True

    def end(self) -> None:
        pass


@torch.no_grad()
def greedy_outputs(
    model,
    tokenizer,
    prompts: list,
    tokens: int,
    context: float,
    fmt: ChatFormat = MODEL_TEMPLATE,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[tuple[torch.Tensor, int]]:
    """The FP16 model's greedy continuation of each prompt (a string: a one-turn chat; or a list of chat
    messages, formatted by `fmt`), `tokens` long or up to the context: (ids [1, prompt + output], prompt
    length) per prompt; with a `temperature` above 0, sampled at it instead (seeded by `seed`: a small model's
    greedy text repeats itself, a sampled one reads on). All prompts decode as one
    left-padded batch: on a CPU a decode step reads every weight whatever the batch, so this costs
    about one prompt's time. Padding can flip a near-tie of the greedy choice; that changes which
    sequence is teacher-forced, not the comparison, which reads every method on the same tokens."""
    chats = [[{"role": "user", "content": p}] if isinstance(p, str) else list(p) for p in prompts]
    texts = [fmt.render(tokenizer, c) for c in chats]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    padless = tokenizer.pad_token_id is None  # padding needs a token; the mask keeps it out of attention
    if padless:
        tokenizer.pad_token = tokenizer.eos_token
    pad = tokenizer.pad_token_id
    try:
        inputs = fmt.encode(tokenizer, texts, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
        if padless:
            tokenizer.pad_token = None
    width = inputs["input_ids"].shape[1]
    n = int(min(tokens, context - width))
    if n < 1:
        raise ValueError(f"--tokens: the prompts ({width} tokens) leave no room in the context ({context})")
    model.set_attn_implementation("sdpa")
    how = {"do_sample": False} if temperature <= 0 else {"do_sample": True, "temperature": temperature, "top_k": 0}
    with tqdm(total=n, desc="FP16 outputs", unit="token") as bar, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            **inputs, max_new_tokens=n, min_new_tokens=n, pad_token_id=pad, streamer=_Progress(bar), **how
        )
    result = []
    for row, mask in zip(out, inputs["attention_mask"], strict=True):
        skip = width - int(mask.sum())  # the left padding
        result.append((row[None, skip:], width - skip))
    return result


#: A greedy output loops from the first position whose next LOOP_SPAN tokens already occurred, in that order,
#: earlier in the output: a model repeating itself there (its later positions measure drift on text it already
#: wrote, where every cache predicts the copy alike).
LOOP_SPAN = 32


def loop_onset(output: list[int], span: int = LOOP_SPAN) -> int | None:
    """The first output position from which the next `span` tokens repeat a run of the output before it (None:
    the output never repeats `span` tokens)."""
    seen: set[tuple[int, ...]] = set()
    for p in range(len(output) - span + 1):
        window = tuple(output[p : p + span])
        if window in seen:
            return p
        seen.add(window)
    return None


def _how(result: dict) -> str:
    """How FP16's outputs were made: greedy, or sampled at a temperature with a seed."""
    sampled = result.get("sampling")
    if not sampled:
        return "FP16 greedy"
    return f"FP16 sampled at temperature {sampled['temperature']:g}, seed {sampled['seed']}"


def _span_note(result: dict) -> str:
    starts = quantized_from(result)
    if starts is None:
        return "; quarters of every output position (the result does not record its prompts' lengths)"
    return (
        f"; quarters of each prompt's output from its first position that reads a quantized page (positions "
        f"{min(starts)}-{max(starts)}: before them every cache is exact)"
    )


def loop_note(result: dict) -> str:
    """What a result's FP16 outputs say of looping ("" where it does not record it): how many prompts loop and
    from which positions, against the positions measured."""
    onsets = result.get("loop_onsets")
    if onsets is None:
        return ""
    looping = sorted(o for o in onsets if o is not None and o < result["summary"]["positions"])
    if not looping:
        return (
            f"; FP16's text repeats no run of {LOOP_SPAN} tokens within the {result['summary']['positions']} "
            "positions measured on any prompt"
        )
    return (
        f"; FP16's text loops (repeats a run of {LOOP_SPAN} tokens) from position "
        + ", ".join(map(str, looping))
        + f" on {len(looping)} of {len(onsets)} prompts: past that a cache's drift is measured on text the model "
        "already wrote"
    )


def read_prompts(path: Path) -> list:
    """The prompts of a JSONL file, each line an object whose "prompt" is a string (a one-turn chat) or a list of
    chat messages ({"role", "content"}); ValueError in one line naming the file and line where one is not."""
    import json

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot be read ({err})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {n}: not JSON ({err.msg})") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        chat = isinstance(prompt, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
        if not (isinstance(prompt, str) and prompt.strip()) and not (chat and prompt):
            raise ValueError(
                f'{path} line {n}: expected an object with a "prompt" (a non-empty string, or a list of chat messages '
                '{"role", "content"})'
            )
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: holds no prompt")
    return prompts


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux reports ru_maxrss in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


def rounded(per_prompt: list[dict]) -> list[dict]:
    """The per-position series to 6 significant digits (far below their noise), as stored."""
    return [
        {name: {metric: [float(f"{x:.6g}") for x in xs] for metric, xs in ms.items()} for name, ms in p.items()}
        for p in per_prompt
    ]


def binned(values: list[float], bins: int) -> list[float]:
    """Means of `bins` consecutive, equal spans of positions."""
    n = len(values)
    edges = [round(i * n / bins) for i in range(bins + 1)]
    return [sum(values[a:b]) / (b - a) for a, b in itertools.pairwise(edges) if b > a]


def summarize(per_prompt: list[dict], bins: int) -> dict:
    """Per method and metric, the mean over prompts of each bin of positions (prompts cut to the shortest)."""
    n = min(len(p["FP16"]["nll"]) for p in per_prompt)
    summary = {"positions": n, "bin_edges": [round(i * n / bins) for i in range(bins + 1)], "methods": {}}
    for name in per_prompt[0]:
        metrics = {}
        for metric in per_prompt[0][name]:
            rows = [binned(p[name][metric][:n], bins) for p in per_prompt]
            metrics[metric] = [sum(col) / len(col) for col in zip(*rows, strict=True)]
        summary["methods"][name] = metrics
    return summary


EQUAL_BITS = 0.05  # key bits within this of PN-Mix's count as "equal bits"


def quarter_means(values: list[float]) -> list[float]:
    """Means of four equal runs of bins (fewer when there are fewer bins): the output in quarters."""
    edges = [round(i * len(values) / min(4, len(values))) for i in range(min(4, len(values)) + 1)]
    return [sum(values[a:b]) / (b - a) for a, b in itertools.pairwise(edges)]


#: Prompts a long-output verdict is decided on at least: each judgement is a sign test over prompts, and fewer
#: prompts cannot show an ordering beyond chance unless they all agree (and a few prompts of one model's text
#: may all repeat themselves alike).
MIN_PROMPTS = 8
#: A sign test over prompts decides at this two-sided p.
ALPHA = 0.05
#: What a long-output verdict says: decided either way, undecided (the test cannot tell, or too few prompts),
#: or not measured (the result lacks what the claim needs).
HOLDS, FAILS, UNDECIDED, NOT_MEASURED = "holds", "fails", "undecided", "not measured"


def first_quantized(prompt_len: int, pages: dict) -> int:
    """The first output position whose prediction reads a quantized page, with the caches' `pages` (group_size,
    residual_length, n_sink): before it every cache is exact and every method's KL is 0."""
    config = PNMixConfig(**pages)
    p = 0
    while token_layout(config, prompt_len + p + 1).n_quantized == 0:
        p += 1
    return p


def quantized_from(result: dict) -> list[int] | None:
    """Each prompt's `first_quantized` position; None where the result does not record its prompts' lengths or
    pages (results of older code)."""
    if not result.get("prompt_lengths") or not result.get("pages"):
        return None
    return [first_quantized(n, result["pages"]) for n in result["prompt_lengths"]]


def per_prompt_quarters(result: dict, name: str) -> list[list[float]] | None:
    """Each prompt's mean KL(FP16 || `name`) per quarter of its output from its first position that reads a
    quantized page (`first_quantized`, where the result records its prompts' lengths) to the shortest prompt's
    last (as the summary is cut); None where the result keeps no per-prompt series of the method."""
    series = result.get("per_prompt")
    if not series or any("kl" not in p.get(name, {}) for p in series):
        return None
    n = min(len(p["FP16"]["nll"]) for p in series)
    starts = quantized_from(result) or [0] * len(series)
    return [quarter_means(p[name]["kl"][min(a, n - 1) : n]) for p, a in zip(series, starts, strict=True)]


def _ordered(pairs: list[tuple[float, float]]) -> tuple[int, int, float]:
    """(prompts where the first is below the second, prompts where above, the sign test's p)."""
    below = sum(a < b for a, b in pairs)
    above = sum(a > b for a, b in pairs)
    return below, above, sign_test(below, above)


def _decide(tests: list[tuple[int, int, float]], prompts: int) -> str:
    """HOLDS where every test's first side wins beyond chance, FAILS where one's loses beyond chance, UNDECIDED
    otherwise or with fewer than MIN_PROMPTS prompts."""
    if prompts < MIN_PROMPTS:
        return UNDECIDED
    if any(above > below and p < ALPHA for below, above, p in tests):
        return FAILS
    return HOLDS if all(below > above and p < ALPHA for below, above, p in tests) else UNDECIDED


def quarter_kl(result: dict) -> dict[str, list[float]]:
    """Each quantized method's mean KL per quarter of the output, as the verdicts test it: over prompts, of each
    prompt's quarters from its first quantized position (`per_prompt_quarters`), where the result keeps them;
    otherwise of the pooled curve."""
    kl = {n: quarter_means(m["kl"]) for n, m in result["summary"]["methods"].items() if "kl" in m}
    for name in kl:
        if quarters := per_prompt_quarters(result, name):
            kl[name] = [statistics.fmean(col) for col in zip(*quarters, strict=True)]
    return kl


def verdicts(result: dict) -> dict[str, tuple[str, str]]:
    """The two long-output judgements the report states, each a sign test over prompts (`per_prompt`: a mean of
    few prompts can hide that they disagree), decided on MIN_PROMPTS prompts at least:
    - "accumulates": every quantized method's KL(FP16 || method) is higher over the last quarter of a prompt's
      output than over its first, on more prompts than chance allows (the premise that error grows with the
      output);
    - "pnmix_lowest": PN-Mix's KL is below that of every method at equal key bits (within EQUAL_BITS) in every
      quarter of the output, prompt by prompt; NOT_MEASURED where the result has no PN-Mix or no equal-bit rival.
    Each as (HOLDS, FAILS, UNDECIDED or NOT_MEASURED, the numbers it was judged on)."""
    methods = result["summary"]["methods"]
    kl = quarter_kl(result)
    fp16 = quarter_means(methods["FP16"]["nll"])
    prompts = len(result.get("per_prompt") or [])
    few = (
        (
            f"; {prompts} prompts kept per prompt: a verdict over prompts needs at least {MIN_PROMPTS}"
            if prompts < MIN_PROMPTS
            else ""
        )
        + loop_note(result)
        + _span_note(result)
    )
    quarters = {n: per_prompt_quarters(result, n) for n in kl}
    means = "; ".join(f"{n} {q[0]:.3g} -> {q[-1]:.3g}" for n, q in kl.items())
    if not kl or any(q is None for q in quarters.values()):
        out = {
            "accumulates": (
                NOT_MEASURED if not kl else UNDECIDED,
                f"mean KL first -> last quarter: {means}; the result keeps no per-prompt series to test over prompts",
            )
        }
    else:
        tests = {n: _ordered([(q[0], q[-1]) for q in quarters[n]]) for n in kl}
        decided = _decide(list(tests.values()), prompts)
        out = {
            "accumulates": (
                decided,
                "KL first -> last quarter of the output, mean over prompts: "
                + means
                + f" (FP16's own NLL {fp16[0]:.3g} -> {fp16[-1]:.3g}); rising on "
                + ", ".join(
                    f"{below} of {prompts} prompts for {n} (sign test p {p:.2g})" for n, (below, _, p) in tests.items()
                )
                + few
                + (resolution(prompts, "prompts", ALPHA) if decided == UNDECIDED else ""),
            )
        }
    bits = result.get("key_bits", {})
    mine = bits.get("PN-Mix")
    rivals = [n for n in kl if n != "PN-Mix" and mine is not None and abs(bits.get(n, math.inf) - mine) <= EQUAL_BITS]
    if "PN-Mix" not in kl or not rivals:
        out["pnmix_lowest"] = (NOT_MEASURED, "no PN-Mix result with a method at equal key bits beside it")
        return out

    def means_of(name: str) -> str:
        return f"{name} ({bits[name]:.3f} key bits) " + ", ".join(f"{x:.3g}" for x in kl[name])

    evidence = "mean KL per quarter of the output: " + "; ".join(map(means_of, ["PN-Mix", *rivals]))
    if any(quarters[n] is None for n in ("PN-Mix", *rivals)):
        out["pnmix_lowest"] = (UNDECIDED, evidence + "; the result keeps no per-prompt series to test over prompts")
        return out
    tests, said = [], []
    for r in rivals:
        for i in range(len(kl["PN-Mix"])):
            below, above, p = _ordered([(a[i], b[i]) for a, b in zip(quarters["PN-Mix"], quarters[r], strict=True)])
            tests.append((below, above, p))
            said.append(f"Q{i + 1} vs {r}: {below} of {prompts} (p {p:.2g})")
    decided = _decide(tests, prompts)
    out["pnmix_lowest"] = (
        decided,
        evidence
        + "; prompts where PN-Mix's KL is lower: "
        + ", ".join(said)
        + few
        + (resolution(prompts, "prompts", ALPHA) if decided == UNDECIDED else ""),
    )
    return out


def markdown(result: dict) -> str:
    """A long-output result's markdown: its title, then `body`."""
    return f"# Fidelity over long outputs: {result['model']}\n" + body(result)


def body(result: dict, level: int = 2) -> str:
    """Everything of a long-output result's markdown below its title, its headings at `level` (the report embeds
    it under headings of its own)."""
    s = result["summary"]
    edges = s["bin_edges"]
    heads = ["method", *(f"{a}-{b}" for a, b in itertools.pairwise(edges))]
    lines = [
        "",
        f"{result['prompts']} prompts, {s['positions']} generated positions each ({_how(result)}), teacher-forced "
        f"through each cache in chunks of {result['chunk']} with stepwise attention; means per span of output "
        f"positions. Measured on {result['device']}, {result['date_utc']}, `{result['command']}`"
        + (loop_note(result).replace("; ", ". ", 1) if "loop_onsets" in result else "")
        + ".\n",
    ]
    for metric, title in (
        ("kl", "KL(FP16 || method), nats"),
        ("top1", "top-1 agreement with FP16"),
        ("nll", "NLL of the FP16 greedy token"),
    ):
        rows = [[n, *(f"{v:.4g}" for v in m[metric])] for n, m in s["methods"].items() if metric in m]
        lines += [f"{'#' * level} {title}\n", tabulate(rows, heads, tablefmt="github"), ""]
    return "\n".join(lines) + "\n"


#: The panels of a long-output figure, the tool's and the report's: (metric, title).
PANELS = (("kl", "KL(FP16 || method), nats"), ("top1", "top-1 agreement with FP16"), ("nll", "NLL of the FP16 token"))


def draw(result: dict, axes, color) -> None:
    """Each method's curve of each metric against the middles of its spans of positions, one panel of PANELS per
    axis of `axes`; `color(name)` gives a method's colour (FP16 has the NLL panel only)."""
    s = result["summary"]
    mids = [(a + b) / 2 for a, b in itertools.pairwise(s["bin_edges"])]
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        for name, m in s["methods"].items():
            if metric in m:
                ax.plot(mids[: len(m[metric])], m[metric], marker="o", ms=3, color=color(name), label=name)
        ax.set_title(title)
        ax.set_xlabel("output position")


def figure(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 4))
    # one colour per method in every panel, and one legend for all of them
    colors = {name: f"C{i}" for i, name in enumerate(result["summary"]["methods"])}
    draw(result, axes, colors.get)
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(f"{result['model'].split(' (')[0]}: fidelity over the output (measured)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below the panels
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.rename(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pnmix-long-output",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a .gguf file, a model folder or a model package")
    parser.add_argument(
        "--tokens", type=positive_int, default=8192, help="generated tokens per prompt (capped by the context)"
    )
    parser.add_argument("--prompts", type=positive_int, default=None, help="the first N prompts of --prompt-set (all)")
    parser.add_argument(
        "--prompt-set",
        type=Path,
        default=PROMPT_SET,
        help='a JSONL file of prompts, one object with a "prompt" per line (default: the repository\'s 16 requests '
        "for long texts)",
    )
    parser.add_argument("--chunk", type=positive_int, default=256, help="tokens per teacher-forced forward")
    parser.add_argument("--bins", type=positive_int, default=16, help="spans of output positions in the curves")
    parser.add_argument(
        "--methods", default=",".join(DEFAULT_METHODS), help="comma-separated names of reference.methods"
    )
    parser.add_argument(
        "--temperature",
        type=non_negative_float,
        default=0.0,
        help="FP16's outputs sampled at this temperature (seeded by --seed) instead of greedy (0, the default)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (with --temperature)")
    parser.add_argument("--smoke", action="store_true", help="64 tokens, one prompt, small pages: checks the harness")
    parser.add_argument("--out", default="benchmarks/results")
    add_options(parser)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS or n == "FP16"]
    if unknown or not names:
        parser.error(f"--methods: unknown {unknown}; choose from {[n for n in METHODS if n != 'FP16']}")
    try:
        prompts = read_prompts(args.prompt_set)
    except ValueError as err:
        parser.error(f"--prompt-set: {err}")
    fmt = preflight.chat_format(parser, args)
    source = preflight.model(parser, args.model, preflight.CHAT, fmt)
    out_dir = preflight.output_folder(parser, args.out)
    tokens, prompts_n, pages = args.tokens, args.prompts, {}
    if args.smoke:
        tokens, prompts_n, pages = min(tokens, 64), 1, {"group_size": 16, "residual_length": 16, "n_sink": 4}
    prompts = prompts[: prompts_n or len(prompts)]
    from pnmix.hf import detect_pair_layout, head_dim  # deferred: transformers takes seconds to import

    model, tokenizer = source.load("sdpa")
    fmt.apply(tokenizer)
    layout = detect_pair_layout(model.config)
    if layout is None:
        parser.error(f"cannot tell the RoPE pair layout of {source.name}")
    configs = {n: METHODS[n](pair_layout=layout, **pages) for n in names}
    context = getattr(model.config, "max_position_embeddings", None) or math.inf
    started = time.monotonic()
    try:
        sequences = greedy_outputs(model, tokenizer, prompts, tokens, context, fmt, args.temperature, args.seed)
    except ValueError as err:  # the prompts fill the context: known once the tokenizer has counted them
        parser.error(str(err))
    per_prompt, lengths = [], []
    for ids, prompt_len in trimmed(tqdm(sequences, desc="teacher-forced methods", unit="prompt")):
        lengths.append(ids.shape[1] - prompt_len)
        per_prompt.append(measure_sequence(model, ids, prompt_len, configs, args.chunk))
    given = {"model": args.model, "tokens": args.tokens, "prompts": args.prompts, "chunk": args.chunk}
    given |= {"methods": args.methods, "prompt-set": code_key(args.prompt_set.resolve())}
    given |= {"temperature": args.temperature, "seed": args.seed}
    defaults = {**vars(parser.parse_args([])), "prompt-set": code_key(PROMPT_SET)}
    options = "".join(f" --{k} {v}" for k, v in given.items() if str(v) != str(defaults.get(k)))
    result = record(
        "long-output",
        model.device,
        command="pnmix-long-output" + options + fmt.options() + (" --smoke" if args.smoke else ""),
        model=source.describe(),
        model_fingerprint=source.fingerprint,
        chat_template=fmt.describe(),
        pair_layout=layout,
        prompt_set=code_key(args.prompt_set.resolve()),
        prompts=len(prompts),
        generated_tokens=lengths,
        prompt_lengths=[n for _, n in sequences],
        sampling={"temperature": args.temperature, "seed": args.seed} if args.temperature > 0 else None,
        loop_onsets=[loop_onset(ids[0, n:].tolist()) for ids, n in sequences],
        chunk=args.chunk,
        pages=pages or {"group_size": 128, "residual_length": 128, "n_sink": 32},
        key_bits={n: round(bit_widths(c, head_dim(model.config)).key_total, 4) for n, c in configs.items()},
        seconds=round(time.monotonic() - started, 1),
        peak_rss_mib=peak_rss_mib(),
        summary=summarize(per_prompt, args.bins),
        per_prompt=rounded(per_prompt),
        behaviour=canaries.record(
            ["FP16", *names], PIPELINE, model_fingerprint=source.fingerprint, data=[args.prompt_set]
        ),
    )
    # compact: 8K positions x metrics x methods
    write_result(
        parser.prog,
        out_dir,
        KIND,
        result,
        extra={".png": lambda p: figure(result, p)},
        compact=True,
    )
    return 0


@torch.no_grad()
def canary() -> dict:
    """The long-output pipeline's canary (`benchmarks.canaries.behaviour`): `measure_sequence` (teacher forcing
    over chunks, stepwise attention, FP16 through transformers' own cache) on the tiny Llama with PN-Mix."""
    import pnmix.hf  # noqa: F401  # deferred: transformers takes seconds to import; registers the "pnmix" attention

    model, _ = workloads.tiny_model("llama")
    prompt = pipelines.PROMPT
    ids = workloads.token_ids(seed=6, tokens=prompt + 2 * pipelines.DECODE)
    configs = {"PN-Mix": workloads.small_pages(method_config("PN-Mix"), model.config.head_dim)}
    out = measure_sequence(model, ids, prompt, configs, chunk=5)
    per = out["PN-Mix"]
    return outcome(
        {"top1": [int(v) for v in per["top1"]]},
        {"kl": per["kl"], "nll": per["nll"], "FP16 nll": out["FP16"]["nll"]},
    )


#: The pipeline a long-output result records, with its canary.
PIPELINE = {"long-output": canary}


def curves_schema(kl: object = schema.DIVERGENCE) -> dict:
    """A method's curves over a long output: one mean per span of positions (its quarters are averaged)."""
    return {
        "kl?": schema.ListOf(kl, nonempty=True),
        "top1?": schema.ListOf(schema.FRACTION, nonempty=True),
        "nll?": schema.ListOf(schema.NONNEGATIVE, nonempty=True),
    }


#: What a long-output result holds, as its readers read it (`markdown`, `verdicts`, the report).
SCHEMA = {
    **schema.MEASUREMENT,
    "prompts": schema.POSITIVE_COUNT,
    "chunk": schema.POSITIVE_COUNT,
    # each prompt's first looping output position (`loop_onset`; results of older code do not record it)
    "loop_onsets?": schema.ListOf(schema.Maybe(schema.COUNT)),
    # each prompt's tokens (results of older code lack them: their quarters start at the first output position)
    "prompt_lengths?": schema.ListOf(schema.POSITIVE_COUNT),
    # FP16's outputs sampled, not greedy (results of older code, and greedy runs, have none)
    "sampling?": schema.Maybe({"temperature": schema.Range(0, 100, above=True), "seed": int}),
    "key_bits?": {"*": schema.BITS},
    "summary": {
        "positions": schema.POSITIVE_COUNT,
        "bin_edges": schema.ListOf(schema.COUNT, nonempty=True),
        "methods": {"FP16": {"nll": schema.ListOf(schema.NONNEGATIVE, nonempty=True)}, "*": curves_schema()},
    },
}


def consistent(data: dict) -> list[tuple[str, str]]:
    """Each curve has one mean per span of positions (the figure plots it against the spans' middles)."""
    spans = len(data["summary"]["bin_edges"]) - 1
    return [
        (
            schema.key(schema.key("summary.methods", name), metric),
            f"has {len(curve)} values, expected one per span of bin_edges ({spans})",
        )
        for name, curves in data["summary"]["methods"].items()
        for metric, curve in curves.items()
        if metric in METRICS and len(curve) != spans
    ]


#: `rounded` keeps 6 significant digits of each position's value: a mean of them is within half a unit of the
#: 6th digit (5e-6 of its size) of the mean the summary was computed from.
ROUNDED = 5e-6


def recomputed(data: dict) -> list[str]:
    """The summary against `summarize` of the per-prompt series the file keeps (a file without them has nothing
    to recompute from)."""
    series = data.get("per_prompt")
    if series is None:
        return []
    summary = data["summary"]
    try:
        again = summarize(series, len(summary["bin_edges"]) - 1)
    except schema.UNCOMPUTABLE as err:
        return [f"per_prompt: its series cannot be summarized ({schema.why(err)})"]
    out = [
        f"summary.{key} is {summary[key]}, its per_prompt series give {again[key]}"
        for key in ("positions", "bin_edges")
        if summary[key] != again[key]
    ]
    given, computed = summary["methods"], again["methods"]
    out += [
        f"summary.methods lacks {name!r}, which its per_prompt series hold" for name in computed if name not in given
    ]
    for name, curves in given.items():
        for metric, curve in curves.items():
            mine = computed.get(name, {}).get(metric)
            where = f"summary.methods[{name!r}].{metric}"
            if mine is None:
                out.append(f"{where} has no per_prompt series to come from")
                continue
            if len(mine) != len(curve):
                out.append(f"{where} has {len(curve)} values, its per_prompt series give {len(mine)}")
                continue
            out += [
                f"{where}[{i}] is {a:.6g}, its per_prompt series give {b:.6g}"
                for i, (a, b) in enumerate(zip(curve, mine, strict=True))
                if not math.isclose(a, b, rel_tol=2 * ROUNDED, abs_tol=1e-12)
            ]
    return out


#: A long-output result: its schema, its markdown, its canary and the checks of its own series.
KIND = schema.Kind(
    "long-output", SCHEMA, render=markdown, pipeline=PIPELINE, consistent=consistent, recomputed=recomputed
)


if __name__ == "__main__":
    raise SystemExit(main())
