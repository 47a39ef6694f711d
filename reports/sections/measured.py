"""Measured results of the GPU suites as rows: grouping into runs, provenance, baselines and the
derived figures (largest feasible throughput, Fig. 7 slopes), shared by the tables and the claims.

Ratios are taken within one result file and one device only, at the same point (batch, length).
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.efficiency.analysis import FIG7_FIT, latency_slope_us
from reports.inputs import Source
from reports.markdown import escape
from reports.provenance import measured

FP16, KITTY, PN_MIX = "FP16", "Kitty", "PN-Mix"


def is_fp16(method: str) -> bool:
    return method.startswith(FP16)  # "FP16", or gpu_check's "FP16 (SDPA)"


def baseline(rows: Sequence[dict], row: dict, match: Sequence[str], which: str, key: str) -> float | None:
    """`key` of the FP16 or Kitty row at the same point as `row` (None if absent or out of memory)."""
    for r in rows:
        if (is_fp16(r["method"]) if which == FP16 else r["method"] == which) and not r.get("oom"):
            if all(r.get(m) == row.get(m) for m in match):
                return r.get(key)
    return None


def runs(entries: Sequence[dict]) -> dict[tuple[str, str], list[dict]]:
    """Entries grouped by (result file, device): the unit within which ratios mean something."""
    out: dict[tuple[str, str], list[dict]] = {}
    for e in entries:
        out.setdefault((e["source"].name, e["device"]), []).append(e)
    return out


def provenance(entries: Sequence[dict]) -> str:
    e = entries[0]
    dates = sorted({x["date_utc"] for x in entries})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commands = "; ".join(sorted({x["command"] for x in entries}))
    return measured(e["device"], when, commands, e["source"].name, f"timing: {e['timing']}")


def max_feasible(rows: Sequence[dict]) -> dict[str, dict]:
    """Each method's highest throughput over the batches that fit."""
    best: dict[str, dict] = {}
    for r in rows:
        if not r["oom"] and (r["method"] not in best or r["tokens_per_s"] > best[r["method"]]["tokens_per_s"]):
            best[r["method"]] = r
    return best


def slopes(rows: Sequence[dict]) -> dict[str, float | None]:
    """Each method's Fig. 7 slope (us/step over FIG7_FIT), None with fewer than two steps in the window."""
    out = {}
    for m in sorted({r["method"] for r in rows}):
        pts = sorted((r["step"], r["step_ms"]) for r in rows if r["method"] == m)
        inside = {s for s, _ in pts if FIG7_FIT[0] <= s <= FIG7_FIT[1]}
        out[m] = latency_slope_us(*zip(*pts, strict=True)) if len(inside) >= 2 else None
    return out


def gpu_check_lines(s: Source) -> list[str]:
    """What a `python -m benchmarks.gpu_check` session ran and how each step ended (its figures are in
    the pytest-benchmark file it names, read as a result of its own)."""
    d = s.data
    head = f"GPU check `{s.name}` ({d.get('device')}, {d.get('date_utc')}, `{d.get('command')}`):"
    steps = [
        f"{name} `{step['command']}` exited {step['exit_code']} after {step['seconds']} s"
        + (
            f" ({step['reason']})"
            if step.get("reason")
            else " (no reason recorded)"
            if step.get("exit_code") not in (0, None)
            else ""
        )
        for name, step in d.get("steps", {}).items()
    ]
    return [escape(head + " " + "; ".join(steps) + ".")]
