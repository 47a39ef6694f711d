"""Section 2: the conformance matrix, implementation x property, from conformance JSON results."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from conformance.loader import builtins
from conformance.strategies import WORKLOAD

from ..inputs import Source
from ..markdown import Section, table

LABELS = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "xfailed": "xfail", "xpassed": "XPASS"}
OUTCOMES = tuple(LABELS)


def _columns(sources: Sequence[Source]) -> dict[tuple, str]:
    """Column key (source index, implementation) -> header; the device is named when sources differ
    in it, and the source number when that still leaves two columns alike."""
    keys = [(i, r["implementation"]) for i, s in enumerate(sources) for r in s.data["results"]]
    keys = list(dict.fromkeys(keys))
    order = list(builtins())
    keys.sort(key=lambda k: (order.index(k[1]) if k[1] in order else len(order), k[1], k[0]))
    devices = {s.data.get("device") for s in sources}
    heads = {k: k[1] + (f" ({sources[k[0]].data.get('device')})" if len(devices) > 1 else "") for k in keys}
    alike = collections.Counter(heads.values())
    return {k: h + (f" #{k[0] + 1}" if alike[h] > 1 else "") for k, h in heads.items()}


def _row_label(record: dict) -> str:
    module = record["module"].rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py").replace("_", " ", 1)
    return f"{module}: {record['property'].removeprefix('test_').replace('_', ' ')}"


def counts(source: Source) -> dict[str, collections.Counter]:
    """Outcomes per implementation of one conformance result."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in source.data["results"]:
        out[r["implementation"]][r["outcome"]] += 1
    return out


def _identity(details: dict | None) -> str:
    """The implementation's version and where it was loaded from ("-" in results that predate them)."""
    if not details:
        return "-"
    return f"{details.get('version', '?')} (`{details.get('origin') or details.get('class', '?')}`)"


def _largest(records: list[dict], name: str) -> str:
    values = [r["measured"][name] for r in records if name in (r.get("measured") or {})]
    return f"{max(values):.3g}" if values else "-"


def _workload() -> str:
    w = WORKLOAD
    c = w.config
    return (
        f"{w.batch} sequence, {w.kv_heads} KV heads x {w.n_rep} query heads, head_dim {w.head_dim}, {w.dtype}, "
        f"{w.prompt}-token prompt then appends of {', '.join(map(str, w.appends))}, {w.kind!r} tokens "
        f"(`conformance.strategies.values`) of seed {w.seed}; asked for H{c.b_high}L{c.b_low} keys, "
        f"{c.value_bits}-bit values, G = {c.group_size}, {c.n_sink} sinks (`conformance.strategies.WORKLOAD`)"
    )


def _provenance(i: int, s: Source) -> str:
    d = s.data
    # results written before `reference.records` carry created_utc and triton_interpret instead
    date = d.get("date_utc") or d.get("created_utc", "?")
    interpret = d.get("machine", {}).get("TRITON_INTERPRET") or d.get("triton_interpret") or "unset"
    return (
        f"#{i + 1}: measured on {d.get('device', '?')}, {date}, hypothesis profile "
        f"{d.get('hypothesis_profile', '?')}, TRITON_INTERPRET={interpret}, "
        f"command `{d.get('command') or s.command or 'not recorded'}`, file `{s.name}`"
    )


def render(sources: Sequence[Source], note: str = "") -> Section:
    if not sources:
        return Section(
            "Conformance matrix", (note or "No conformance results: the suite was not run and none given.") + "\n"
        )
    columns = _columns(sources)
    cells: dict[str, dict[tuple, collections.Counter]] = {}
    reasons: dict[str, int] = {}
    for i, s in enumerate(sources):
        for r in s.data["results"]:
            cell = cells.setdefault(_row_label(r), {}).setdefault((i, r["implementation"]), collections.Counter())
            label = LABELS.get(r["outcome"], r["outcome"])
            reason = (r.get("reason") or "").strip().splitlines()
            if reason and r["outcome"] != "passed":
                text = reason[0][:200]
                label += f" [{reasons.setdefault(text, len(reasons) + 1)}]"
            cell[label] += 1

    def show(c: collections.Counter | None) -> str:
        if not c:
            return "-"
        return ", ".join(label if n == 1 else f"{label} x{n}" for label, n in c.items())

    matrix = [[prop, *(show(row.get(k)) for k in columns)] for prop, row in cells.items()]
    provenance = "; ".join(_provenance(i, s) for i, s in enumerate(sources))
    summary = []
    for i, s in enumerate(sources):
        details = {d["name"]: d for d in s.data.get("implementation_details", [])}
        for impl, c in counts(s).items():
            col = columns[(i, impl)]
            mine = [r for r in s.data["results"] if r["implementation"] == impl]
            summary.append(
                [
                    col,
                    _identity(details.get(impl)),
                    *(c[o] for o in OUTCOMES),
                    sum(c.values()),
                    round(sum(r["duration_s"] for r in mine), 1),
                    _largest(mine, "spec_distance"),
                    _largest(mine, "workload_bits_per_element"),
                    _largest(mine, "workload_attention_error"),
                ]
            )
    parts = [
        (note + "\n") if note else "",
        "Outcome of every property (rows) for every implementation (columns). pass: holds on every generated "
        "example; skip: the implementation does not claim the capability the property needs (reason below); "
        "xfail: a listed known failure; FAIL: a counterexample was found.\n",
        table(matrix, ["property", *columns.values()], provenance),
        "Reasons:\n\n" + "\n".join(f"{n}. {text}" for text, n in reasons.items()) + "\n" if reasons else "",
        "### Counts\n",
        table(
            summary,
            [
                "implementation",
                "version (import path)",
                *OUTCOMES,
                "total",
                "test seconds",
                "spec distance",
                "bits/element",
                "attention error",
            ],
            "the result files of the matrix above",
        ),
        "spec distance: the largest max-abs difference, over the examples of property 7, between the "
        "implementation's attention output and float64 attention over the spec's cache of the same tokens "
        "(measured; judged only where the implementation claims the reference numerics). "
        f"bits/element and attention error: measured on one common workload ({_workload()}), each "
        "implementation with its own bits, groups and residual: the bytes its cache holds (counted from its "
        "tensors; from its own report where they cannot be seen) x 8 per cached key and value element, "
        "sinks and exact residual included, and the max-abs difference of its decode attention from float64 "
        "attention over the exact tokens (`test_the_common_workload_*`).\n",
    ]
    return Section("Conformance matrix", "\n".join(p for p in parts if p))
