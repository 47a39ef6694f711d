"""TriAxialKV calibration (arXiv 2605.17170): per-tag distortion on a real model, and the allocation.

    pnmix-role-calibration [--model M] [--layers 5] [--budgets 3.25 3.5 4] [--chat-template FILE]

Runs the prefill of every conversation of the calibration split (`benchmarks.fidelity.conversations`)
through the model, captures the queries, keys and values (after RoPE) of `--layers` layers spread
across depth, tags every token (`reference.tokens.roles`, from the markers of the model's own ChatML chat
template, or of `--chat-template FILE`'s for a model that ships none), and measures
for every tag and precision D_k(b) = the sum over layers of the mean over the requests that hold
the tag of the worst query head's attention-output MSE (`reference.tokens.distortion`: the tag's
tokens at b bits, the rest exact), for TriAxialKV's storage (or, by `calibrate`'s config, role-aware
PN-Mix's: `reference.methods.TOKEN_METHODS`).
Then `reference.tokens.allocation.allocate` picks INT2 or INT4 per tag at each budget, in bits per
element with everything stored counted (payload, scales and zeros: at G = 32 and float16 scales
INT2 costs 3 bits and INT4 5). Writes JSON and markdown atomically to new files.
"""

from __future__ import annotations

import argparse
import math
import shlex

import torch
from tabulate import tabulate
from tqdm import tqdm

from benchmarks.canaries import behaviour as canaries
from benchmarks.canaries import workloads
from benchmarks.canaries.outcome import outcome
from benchmarks.commands import preflight
from benchmarks.commands.saving import write_result
from benchmarks.fidelity import conversations
from benchmarks.models.chat_format import add_options
from benchmarks.models.source import DEFAULT as DEFAULT_MODEL
from reference import schema
from reference.cli import positive_int
from reference.methods import TOKENS, names
from reference.records import command_line, record
from reference.tokens.allocation import allocate
from reference.tokens.config import TokenPrecisionConfig, precision_cost
from reference.tokens.distortion import tag_distortion
from reference.tokens.roles import ALL_TAGS, tag_conversation, tag_table

CAPTURE = "pnmix_capture"
DEFAULT_BUDGETS = (3.25, 3.5, 4.0)


def spread_layers(n_layers: int, count: int) -> list[int]:
    """`count` layer indices spread evenly from the first to the last."""
    count = min(count, n_layers)
    return sorted({round(i * (n_layers - 1) / max(count - 1, 1)) for i in range(count)})


def cache_layers(model_config, count: int) -> list[int]:
    """`count` of the layers that hold a method's cache, spread across depth: a layer with an attention window
    keeps an exact cache (`pnmix.hf`), and its attention is not the full causal attention measured here."""
    from pnmix.hf import layer_windows  # deferred: transformers takes seconds to import

    full = [i for i, window in enumerate(layer_windows(model_config)) if window is None]
    if not full:
        raise ValueError("every attention layer of this model has a window: no layer holds a method's cache")
    return [full[i] for i in spread_layers(len(full), count)]


class _Capture:
    """An attention function that records (q, k, v, scaling) of chosen layers, then runs SDPA."""

    def __init__(self, layers: list[int]):
        self.layers, self.seen = set(layers), {}

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if module.layer_idx in self.layers:
            self.seen[module.layer_idx] = (query[0].detach(), key[0].detach(), value[0].detach(), module.scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register(capture: _Capture) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE, capture)
    AttentionMaskInterface.register(CAPTURE, sdpa_mask)


@torch.no_grad()
def capture(model, tokenizer, conversations, layers: list[int]) -> list[tuple[list, list, dict]]:
    """(input ids, tags, {layer: (q, k, v, scaling)}) of each conversation's prefill (rows with `messages`)."""
    capture = _Capture(layers)
    _register(capture)
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE)
    out = []
    try:
        for row in tqdm(conversations, desc="capture q, k, v", unit="conversation"):
            ids, tags = tag_conversation(tokenizer, row["messages"])
            capture.seen = {}
            model(input_ids=torch.tensor([ids]))
            if set(capture.seen) != set(layers):
                raise RuntimeError(f"the model did not attend through layers {sorted(set(layers) - set(capture.seen))}")
            out.append((ids, tags, dict(capture.seen)))
    finally:
        model.set_attn_implementation(previous)
    return out


def calibrate(
    model, tokenizer, conversations, layers: list[int], config: TokenPrecisionConfig | None = None, captured=None
) -> dict:
    """Tags, token counts and D[tag, precision] (module doc) over `conversations` (rows with
    `messages`), for the store of `config` (TriAxialKV's by default); `captured`: `capture`'s result, if
    already taken."""
    config = TokenPrecisionConfig() if config is None else config
    per_request = capture(model, tokenizer, conversations, layers) if captured is None else captured
    table = tag_table([t for _, tags, _ in per_request for t in tags])
    total = torch.zeros(len(table), len(config.precisions), dtype=torch.float64)
    for layer in layers:
        runs = []
        for _, tags, seen in per_request:
            q, k, v, scale = seen[layer]
            runs.append(tag_distortion(q, k, v, tags, table, config, scale=scale))
        runs = torch.stack(runs)
        total += torch.nanmean(runs, dim=0)  # the mean over the requests that hold the tag
    counts = [sum(t == tag for _, tags, _ in per_request for t in tags) for tag in table]
    return {
        "tags": [str(t) for t in table],
        "tokens": counts,
        "distortion": total.tolist(),
        "requests": len(per_request),
    }


def allocations(calibration: dict, budgets, config: TokenPrecisionConfig | None = None) -> list[dict]:
    """The allocator's choice of bits per tag at each budget (average key + value bits per element,
    payload, scales and zeros counted: `reference.tokens.config.precision_cost`)."""
    config = TokenPrecisionConfig() if config is None else config
    costs = torch.tensor([precision_cost(config, b) for b in config.precisions])
    out = []
    for budget in budgets:
        result = allocate(torch.tensor(calibration["distortion"]), torch.tensor(calibration["tokens"]), costs, budget)
        bits = [config.precisions[c] for c in result.choice]
        out.append(
            {
                "budget": budget,
                "bits": bits,
                "average_bits": result.average_bits,
                "distortion": result.distortion,
                "search": result.search,
            }
        )
    return out


def render(result: dict) -> str:
    cal = result["calibration"]
    allocated = result["allocations"]
    rows = [
        [tag, n, *d] + [a["bits"][i] for a in allocated]
        for i, (tag, n, d) in enumerate(zip(cal["tags"], cal["tokens"], cal["distortion"], strict=True))
    ]
    head = [
        "tag",
        "tokens",
        *(f"D(INT{b})" for b in TokenPrecisionConfig().precisions),
        *(f"bits @ {a['budget']}" for a in allocated),
    ]
    return "\n".join(
        [
            f"# TriAxialKV calibration: {result['model']['name']}",
            "",
            f"Command `{result['command']}`, {cal['requests']} conversations, layers {result['layers']}, "
            f"G = {result['group_size']}. D: attention-output MSE of the worst head, mean over the requests that "
            "hold the tag, summed over the layers (`reference.tokens.distortion`).",
            "",
            tabulate(rows, head, tablefmt="github", floatfmt=".3e"),
            "",
            tabulate(
                [[a["budget"], a["average_bits"], a["distortion"], a["search"]] for a in result["allocations"]],
                ["budget (bits/element)", "allocated", "total D", "search"],
                tablefmt="github",
                floatfmt=".4g",
            ),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pnmix-role-calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a .gguf file, a model folder or a model package")
    parser.add_argument(
        "--layers",
        type=positive_int,
        default=5,
        help="layers captured, spread across depth (of those a method's cache quantizes)",
    )
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=list(DEFAULT_BUDGETS),
        help="average key+value bits per element, everything stored counted",
    )
    parser.add_argument("--group-size", type=positive_int, default=TokenPrecisionConfig().group_size)
    parser.add_argument("--out", default="benchmarks/results")
    add_options(parser, plain=False)  # the tags are read from the template's markers: no plain prompts
    args = parser.parse_args(argv)
    for budget in args.budgets:
        if not (budget > 0 and budget < float("inf")):
            parser.error(f"--budgets must be positive finite numbers, got {budget}")
    try:
        config = TokenPrecisionConfig(group_size=args.group_size)
    except ValueError as err:
        parser.error(f"--group-size: {err}")

    fmt = preflight.chat_format(parser, args)
    source = preflight.model(parser, args.model, preflight.ROLES, fmt)
    out = preflight.output_folder(parser, args.out)
    model, tokenizer = source.load("sdpa")
    fmt.apply(tokenizer)
    layers = cache_layers(model.config, args.layers)
    cal = calibrate(model, tokenizer, conversations.load("calibration"), layers, config)
    result = record(
        "role-calibration",
        # as typed (`records.command_line`), or, called with `argv`, as the console script would be
        command=command_line() if argv is None else shlex.join([parser.prog, *argv]),
        model={"name": source.name, "fingerprint": source.fingerprint, "source": source.describe()},
        chat_template=fmt.describe(),
        layers=layers,
        group_size=args.group_size,
        calibration=cal,
        allocations=allocations(cal, args.budgets, config),
        behaviour=canaries.record(
            names(precision=TOKENS), PIPELINE, model_fingerprint=source.fingerprint, data=[conversations.DATA]
        ),
    )
    write_result(parser.prog, out, KIND, result)
    return 0


#: The role-calibration canary's budgets (average key + value bits per element).
CANARY_BUDGETS = (3.25, 3.5, 4.0)


@torch.no_grad()
def canary() -> dict:
    """The role-calibration pipeline's canary (`benchmarks.canaries.behaviour`): `calibrate` (per-tag distortion
    at each precision) on two requests of seeded queries, keys, values and tags captured from one layer, then
    `allocations` at CANARY_BUDGETS."""
    config = TokenPrecisionConfig()
    captured = []
    for seed in (9, 10):
        q, k, v = workloads.qkv(seed=seed, tokens=2 * config.group_size)
        g = torch.Generator().manual_seed(seed)
        tags = [ALL_TAGS[i] for i in torch.randint(0, 6, (k.shape[2],), generator=g).tolist()]
        captured.append(([], tags, {0: (q[0], k[0], v[0], k.shape[-1] ** -0.5)}))  # [H, T, d] as captured
    calibration = calibrate(None, None, None, [0], config, captured=captured)
    chosen = allocations(calibration, CANARY_BUDGETS, config)
    return outcome(
        {"tags": calibration["tags"], "tokens": calibration["tokens"], "bits": [a["bits"] for a in chosen]},
        {
            "distortion": [x for row in calibration["distortion"] for x in row],
            "average bits": [a["average_bits"] for a in chosen],
        },
    )


#: The pipeline a role-calibration result records, with its canary.
PIPELINE = {"role-calibration": canary}


#: What a role-calibration result holds, as its readers read it (`render`, the report, `equal_bits`).
SCHEMA = {
    "model": {"name": str, "fingerprint": str},
    "command": str,
    "layers": schema.ListOf(schema.LAYER, nonempty=True),
    "group_size": schema.POSITIVE_COUNT,
    "calibration": {
        "tags": schema.ListOf(str, nonempty=True),
        "tokens": schema.ListOf(schema.COUNT, nonempty=True),
        "distortion": schema.ListOf(schema.ListOf(schema.NONNEGATIVE, nonempty=True), nonempty=True),
        "requests": schema.COUNT,
    },
    "allocations": schema.ListOf(
        {
            "budget": schema.BITS,
            "bits": schema.ListOf(schema.BIT_WIDTH),
            "average_bits": schema.BITS,
            "distortion": schema.NONNEGATIVE,
            "search": str,
        }
    ),
}


def recomputed(data: dict) -> list[str]:
    """The allocations (bits per tag at each budget, their average and total distortion) against `allocations`
    of the file's own calibration table, at its group size."""
    config = TokenPrecisionConfig(group_size=data["group_size"])
    budgets = [a["budget"] for a in data["allocations"]]
    try:
        again = allocations(data["calibration"], budgets, config)
    except schema.UNCOMPUTABLE as err:
        return [f"allocations: cannot be recomputed from its calibration ({schema.why(err)})"]
    out = []
    for i, (given, mine) in enumerate(zip(data["allocations"], again, strict=True)):
        where = f"allocations[{i}] (budget {given['budget']:g})"
        if given["bits"] != mine["bits"]:
            out.append(f"{where}.bits are {given['bits']}, its calibration gives {mine['bits']}")
        for key in ("average_bits", "distortion"):
            if not math.isclose(given[key], mine[key], rel_tol=1e-9, abs_tol=1e-12):
                out.append(f"{where}.{key} is {given[key]:.6g}, its calibration gives {mine[key]:.6g}")
    return out


#: A role-calibration result: its schema, its markdown, its canary and the check of its allocations.
KIND = schema.Kind("role-calibration", SCHEMA, render=render, pipeline=PIPELINE, recomputed=recomputed)


if __name__ == "__main__":
    raise SystemExit(main())
