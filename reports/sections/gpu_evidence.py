"""Page 1's word on the GPU half: every result file a GPU made, current or under History, by device and day,
with what it found (decode-kernel time against FP16's, conformance verdicts) and why it is not current, so
that the first screen says what is known on a GPU before any CPU table is read."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from reports.currency import Verdict
from reports.inputs import BENCHMARK, Source, benchmarks
from reports.markdown import escape
from reports.sections import conformance as matrix
from reports.sections import history, summary

#: What a file of each kind found, said at most this many times a line: past it, a count.
SHOWN_FINDINGS = 3


def on_gpu(device: str | None) -> bool:
    """Whether a recorded device is a GPU (not a CPU, not unrecorded)."""
    return bool(device) and device != "?" and not device.lower().startswith("cpu")


def _kernel(source: Source) -> list[str]:
    """Each method's decode-kernel time against FP16's at the largest context the file timed."""
    entries = [{**e, "implementation": e["method"]} for e in benchmarks([source], summary.SPEED_SUITE, "full")]
    return [
        f"{method} {summary.speed_text(points)}" for method, points in summary.speed_rows(entries).items() if points
    ]


def findings(source: Source) -> list[str]:
    """What a GPU-made file found, in a few words each."""
    if source.kind == "conformance":
        return [f"{name} {matrix.verdict(recs)}" for (name, _), recs in matrix.records_by_column([source]).items()]
    if source.kind == BENCHMARK:
        return _kernel(source)
    return []


def render(current: Sequence[Source], older: Sequence[tuple[Source, Verdict]]) -> str:
    """One line per device, day and state (current, or under History with the reasons), with what its files
    found; a line saying that there is none where no file read was made on a GPU."""
    groups: dict[tuple, dict] = collections.defaultdict(lambda: {"files": 0, "found": [], "why": set()})
    for source, verdict in [*((s, None) for s in current), *older]:
        for device in history.device_of(source).split(", "):
            if not on_gpu(device):
                continue
            g = groups[(device, history.date_of(source)[:10], verdict is None)]
            g["files"] += 1
            g["found"] += findings(source)
            if verdict is not None:
                g["why"].add(verdict.why)
    predicted = (
        "the decode kernel's GPU speed of this tree is predicted by the gate (`python -m pnmix.aot`, "
        "docs/gpu-gate.md), not measured"
    )
    if not groups:
        return f"**GPU evidence**: none. No result file read was made on a GPU: {predicted}.\n"
    lines = []
    # the current first, then the newest
    for (device, day, is_current), g in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][1]), reverse=True):
        state = "current." if is_current else f"under History, not compared. Why: {'; '.join(sorted(g['why']))}."
        found = g["found"][:SHOWN_FINDINGS]
        more = f" and {len(g['found']) - SHOWN_FINDINGS} more" if len(g["found"]) > SHOWN_FINDINGS else ""
        said = f" Found: {'; '.join(found)}{more}." if found else ""
        lines.append(f"- {device}, {day}, {g['files']} file(s), {state}{said}")
    head = "**GPU evidence** (every result file a GPU made)" + ("" if any(k[2] for k in groups) else f"; {predicted}")
    return head + ":\n\n" + "\n".join(escape(x) for x in lines) + "\n"
