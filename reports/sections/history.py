"""History: results whose behaviour this tree no longer reproduces, or of code that it no longer has
(`reports.currency`), or refused when read (`reports.inputs.load`), each labelled with its commit and why, with
what it measured. None of them enters a comparison."""

from __future__ import annotations

from collections.abc import Sequence

from reports.currency import Verdict
from reports.inputs import BENCHMARK, Source, usable
from reports.markdown import Section, details, escape, fmt, table
from reports.sections import conformance as matrix
from reports.sections.performance import POINT_KEYS, TINY_FIGURE


def _measured(source: Source) -> str:
    """What an old result measured, in a few lines."""
    if source.kind == "conformance":
        columns = matrix.records_by_column([source])
        lines = [f"- {name}: {matrix.verdict(recs)}" for (name, _), recs in columns.items()]
        failures = [
            f"  - {matrix.short_property(r)}: {matrix.first_line(r.get('reason'))}"
            for recs in columns.values()
            for r in recs
            if r["outcome"] == "failed"
        ]
        return "\n".join(map(escape, lines + failures))
    if source.kind == BENCHMARK:
        rows = []
        for e in usable(source):
            label, key = TINY_FIGURE.get(e["suite"], ("", ""))
            point = ", ".join(f"{k} {e[k]}" for k in POINT_KEYS if e.get(k) is not None)
            rows.append(
                [e["suite"], e["scale"], e["method"], point, label, "OOM" if e.get("oom") else fmt(e.get(key), ".4g")]
            )
        if not rows:
            return "no benchmark of a suite this report reads"
        return table(rows, ["suite", "scale", "method", "point", "figure", "value"], f"measured, `{source.name}`")
    d = source.data
    what = d.get("model") if isinstance(d.get("model"), str) else (d.get("model") or {}).get("name")
    command = d.get("command", "not recorded")
    return escape(f"{source.kind} result" + (f" on {what}" if what else "") + f", command `{command}`")


def date_of(source: Source) -> str:
    d = source.data
    if source.kind == BENCHMARK:
        return d.get("datetime") or "?"
    return d.get("date_utc") or d.get("created_utc") or "?"


def device_of(source: Source) -> str:
    if source.kind == BENCHMARK:
        devices = {(b.get("extra_info") or {}).get("device") for b in source.data["benchmarks"]}
        return ", ".join(sorted(d for d in devices if d)) or "?"
    return source.data.get("device", "?")


def render(history: Sequence[tuple[Source, Verdict]]) -> Section:
    if not history:
        return Section("History", "Every result read measured the code of this tree: there is no history.\n")
    rows = [
        [f"`{s.name}`", s.kind, device_of(s), date_of(s), (v.commit or "not recorded")[:12], v.why] for s, v in history
    ]
    parts = [
        "Measurements whose canaries this tree does not reproduce (the same code paths on fixed tiny "
        "workloads: a method, an implementation or a tool's step that computes something else now, named), "
        "or that record none; conformance and timing files of code that differs from this tree's, or that do "
        "not record which code they measured; and results refused because an aggregate or verdict they hold is "
        "not what their own outcomes give (recomputed when read). They are kept (in the repository or where they "
        "were given) and "
        "shown here with their commit; no comparison above uses them.\n",
        table(rows, ["file", "kind", "device", "date", "commit", "why not current"], "each file as it records itself"),
    ]
    for s, v in history:
        parts.append(details(f"{s.name} (commit {(v.commit or 'not recorded')[:12]})", _measured(s)))
    return Section("History", "\n".join(parts))
