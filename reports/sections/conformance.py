"""The conformance matrix: one column per implementation and device, rows in property order, from
conformance JSON results. A property an implementation does not claim reads "not claimed" (its claims
are listed once, under the matrix); a failure reads FAIL with a note that gives the property's own
message and the example that failed, as fitted to the implementation's claims and shrunk."""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

from conformance.loader import builtins
from reports.inputs import Source
from reports.markdown import Section, escape, table

#: How each outcome reads; a measurement has no row (it is listed under the matrix, no verdict).
LABELS = {
    "passed": "pass",
    "failed": "FAIL",
    "skipped": "skip",
    "xfailed": "xfail",
    "xpassed": "XPASS",
    "measured": "measured",
}
OUTCOMES = tuple(LABELS)
NOT_CLAIMED = "not claimed"
#: A property none of whose examples ran (every one outside the claims): neither a pass nor a skip.
NOT_RUN = "not run"
#: How every skip for a missing claim reads (conformance.plugin): "<name> does not claim <what>".
_CLAIM_SKIP = re.compile(r"^\S+ does not claim ")
#: Outcomes that break conformance: a counterexample, or a listed known failure that no longer fails.
BREAKING = ("failed", "xpassed")


# -- what each result record is ------------------------------------------------------------


def property_key(record: dict) -> tuple[int, str]:
    """Sort key of a property: its number (p2 before p10), then the module."""
    number = re.search(r"test_p(\d+)_", record["module"])
    return (int(number.group(1)) if number else 10**6, record["module"])


def property_label(record: dict) -> str:
    """'P7 attention: decode attention within the low precision error'."""
    module = record["module"].rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py")
    number, _, topic = module.partition("_")
    name = record["property"].removeprefix("test_").replace("_", " ")
    return f"{number.upper()} {topic.replace('_', ' ')}: {name}"


def short_property(record: dict) -> str:
    """'P7 decode attention within the low precision error' (for a list of failing properties)."""
    number = record["module"].rsplit("/", 1)[-1].removeprefix("test_").partition("_")[0]
    return f"{number.upper()} {record['property'].removeprefix('test_').replace('_', ' ')}"


def is_not_claimed(record: dict) -> bool:
    return record["outcome"] == "skipped" and bool(_CLAIM_SKIP.match(record.get("reason") or ""))


def is_not_run(record: dict) -> bool:
    """Claimed, counted, and no example ran (results that predate the count are judged by their outcome)."""
    examples = record.get("examples")
    counted = examples is not None and examples["run"] == 0 and record["outcome"] in ("passed", "skipped")
    return counted and not is_not_claimed(record)


def first_line(text: str | None) -> str:
    """The first non-blank line, whole: a note cut mid-word loses the part that says what differed."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def device_label(device: str | None) -> str:
    """'cpu' or the GPU's name without its vendor: the column heads stay short."""
    device = device or "?"
    return "cpu" if device.startswith("cpu") else device.removeprefix("NVIDIA ")


def order(names) -> list[str]:
    """Implementations in the built-ins' order, then the others by name."""
    known = list(builtins())
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


# -- per implementation --------------------------------------------------------------------


def records_by_column(sources: Sequence[Source]) -> dict[tuple[str, str], list[dict]]:
    """(implementation, device) -> its result records, over every source."""
    out: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for s in sources:
        for i, r in enumerate(s.data["results"]):
            out[(r["implementation"], device_label(s.data.get("device")))].append({**r, "source": s, "index": i})
    ordered = order(n for n, _ in out)
    return dict(sorted(out.items(), key=lambda kv: (ordered.index(kv[0][0]), kv[0][1])))


def verdict(records: Sequence[dict], brief: bool = False) -> str:
    """One implementation's verdict on one device, from its property results; `brief`: without the counts, a
    failing property by its number alone ('FAILS P7, P3')."""
    broken = sorted({short_property(r) for r in records if r["outcome"] in BREAKING})
    if broken:
        if brief:
            return "FAILS " + ", ".join(sorted({b.split()[0] for b in broken}))
        return "FAILS " + "; ".join(broken)
    counts = collections.Counter(r["outcome"] for r in records if not is_not_run(r))
    if not counts["passed"]:
        return "not run: no property applies"
    if brief:
        return f"conforms except {counts['xfailed']} listed differences" if counts["xfailed"] else "conforms"
    parts = [f"{counts['passed']} pass"]
    claimed_out = sum(map(is_not_claimed, records))
    if claimed_out:
        parts.append(f"{claimed_out} not claimed")
    not_run = sum(map(is_not_run, records))
    if not_run:
        parts.append(f"{not_run} {NOT_RUN}: no example fits the claims")
    if counts["xfailed"]:  # listed by whoever runs it, with a reason each: not a pass
        return f"conforms except {counts['xfailed']} listed differences (" + ", ".join(parts) + ")"
    return "conforms (" + ", ".join(parts) + ")"


def details_of(sources: Sequence[Source]) -> dict[str, dict]:
    """Each implementation's recorded details (version, origin, claims), the newest source's winning."""
    out: dict[str, dict] = {}
    for s in sources:
        for d in s.data.get("implementation_details") or []:
            out[d["name"]] = d
    return out


def identity(details: dict | None) -> str:
    if not details:
        return "version not recorded"
    return f"{details.get('version', '?')}, `{details.get('origin') or details.get('class', '?')}`"


def claims_text(details: dict | None) -> str:
    """The claims an implementation made, on one line ('not recorded' in results that predate them)."""
    claims = (details or {}).get("claims")
    if not claims:
        return "claims not recorded in its result"
    shown = []
    for key, value in claims.items():
        if isinstance(value, list):
            value = ", ".join(map(str, value)) or "none"
        shown.append(f"{key}: {value}")
    return "; ".join(shown)


# -- the section ---------------------------------------------------------------------------


#: What the conformance suite measures an implementation holding on its realistic workload (test_p8_storage.py).
HELD_BITS, HELD_KEY_BITS, HELD_VALUE_BITS = (
    "realistic_bits_per_element",
    "realistic_key_bits_per_element",
    "realistic_value_bits_per_element",
)


def largest(records: Sequence[dict], key: str) -> float | None:
    """The largest number the records measured under `key` (None: none did)."""
    values = [r["measured"][key] for r in records if isinstance((r.get("measured") or {}).get(key), (int, float))]
    return max(values) if values else None


def held_bits(records: Sequence[dict]) -> str:
    """Bits per element an implementation held on the realistic workload, measured (its exact residual and
    sinks included, so above the storage section's count): '2.68 (K 2.68, V 2.68)', '-' where none."""
    total = largest(records, HELD_BITS)
    if total is None:
        return "-"
    key, value = largest(records, HELD_KEY_BITS), largest(records, HELD_VALUE_BITS)
    split = f" (K {key:.2f}, V {value:.2f})" if key is not None and value is not None else ""
    return f"{total:.2f}{split}"


def _held_table(columns: dict[tuple[str, str], list[dict]]) -> str:
    """What each implementation held on the realistic workload, by the workload it ran (measured)."""
    rows = []
    names = order({n for n, _ in columns})
    for (name, device), recs in sorted(columns.items(), key=lambda kv: (names.index(kv[0][0]), kv[0][1])):
        by_workload: dict[str, list[dict]] = collections.defaultdict(list)
        for r in recs:
            ran = (r.get("measured") or {}).get("realistic_workload")
            if ran is not None:
                by_workload[ran].append(r)
        for ran, of_it in sorted(by_workload.items()):
            if largest(of_it, HELD_BITS) is not None:
                rows.append([name, device_label(device), ran, held_bits(of_it)])
    if not rows:
        return ""
    return (
        "Bits held on the realistic workload, measured: every byte the cache holds (packed codes, scales and "
        "zeros, metadata, sinks and the exact residual, and bytes an implementation keeps for bookkeeping) x 8 / "
        "the keys and values it caches; K and V split where its storage report says whose bytes are whose. "
        "With its exact residual and sinks on a few thousand tokens this is above the storage section's count "
        "of the same configuration, the number every other section gives.\n\n"
        + table(
            rows,
            ["implementation", "device", "workload as run", "bits held / element"],
            "measured, the conformance results above",
        )
    )


def render(sources: Sequence[Source], note: str = "") -> Section:
    if not sources:
        return Section(
            "Conformance matrix",
            (note or "No current conformance results: the suite was not run and none given.") + "\n",
        )
    columns = records_by_column(sources)
    several_devices = len({dev for _, dev in columns}) > 1
    heads = {key: key[0] + (f" ({key[1]})" if several_devices else "") for key in columns}
    rows: dict[tuple, dict] = {}
    notes: dict[str, int] = {}
    measurements: dict[str, None] = {}  # tests that record numbers and judge nothing: no row of verdicts
    for key, recs in columns.items():
        for r in recs:
            if r["outcome"] == "measured":
                measurements[property_label(r)] = None
                continue
            key_ = (property_key(r), r["property"])
            row = rows.setdefault(key_, {"label": property_label(r), "cells": {}, "seen": r["index"]})
            row["seen"] = min(row["seen"], r["index"])
            row["cells"].setdefault(key, collections.Counter())[_cell(r, notes)] += 1

    def show(c: collections.Counter | None) -> str:
        if not c:
            return "-"
        noted: dict[str, list[int]] = {}  # outcome -> note numbers, so that a cell stays short
        plain = []
        for label, n in c.items():
            outcome, _, number = label.partition(" [")
            if number:
                noted.setdefault(outcome, []).extend([int(number.rstrip("]"))] * n)
            else:
                plain.append(label if n == 1 else f"{label} x{n}")
        for outcome, numbers in noted.items():
            count = f" x{len(numbers)}" if len(numbers) > 1 else ""
            plain.append(f"{outcome}{count} [{_ranges(sorted(set(numbers)))}]")
        return ", ".join(plain)

    # in the suite's order: by property number, then as the suite defines them (the order results arrive in)
    ordered = sorted(rows.items(), key=lambda kv: (kv[0][0], kv[1]["seen"]))
    matrix = [[row["label"], *(show(row["cells"].get(k)) for k in columns)] for _, row in ordered]
    source_line = (
        "measured, the conformance results "
        + ", ".join(f"`{s.name}`" for s in sources)
        + (" (device, date, hypothesis profile and command of each: the list of result files)")
    )
    details = details_of(sources)
    claims = [
        escape(f"- **{name}** ({identity(details.get(name))}): {claims_text(details.get(name))}")
        for name in order({n for n, _ in columns})
    ]
    parts = [
        (note + "\n") if note else "",
        "Every property (rows, in the suite's order) for every implementation and device (columns). pass: holds "
        "on every example drawn; not claimed: the implementation does not claim what the property needs (its "
        "claims are listed below); xfail [n]: a known difference listed for it, note n; FAIL [n]: a "
        "counterexample, note n gives the property's message and the example (fitted to the claims, shrunk); "
        "not run [n]: no example of the property fits the claims, so none ran (note n says why); "
        "n/a [n]: the property does not apply, note n says why.\n",
        table(matrix, ["property", *heads.values()], source_line),
        "Measurements, not verdicts (what they record is in the summary): "
        + "; ".join(escape(m) for m in measurements)
        + ".\n"
        if measurements
        else "",
        _held_table(columns),
        "Notes:\n\n" + "\n".join(f"{n}. {escape(text)}" for text, n in notes.items()) + "\n" if notes else "",
        "Claims of each implementation (`reference.contract.Capabilities`):\n\n" + "\n".join(claims) + "\n",
    ]
    return Section("Conformance matrix", "\n".join(p for p in parts if p))


def _ranges(numbers: list[int]) -> str:
    """[6, 7, 8, 10] -> '6-8, 10'."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _cell(record: dict, notes: dict[str, int]) -> str:
    """The matrix cell of one result; its note (message, example, reason) numbered in `notes`."""
    outcome = record["outcome"]
    if is_not_run(record):
        why = first_line(record.get("reason")) or "no example ran"
        return f"{NOT_RUN} [{notes.setdefault(why, len(notes) + 1)}]"
    if outcome == "passed":
        return "pass"
    if is_not_claimed(record):
        return NOT_CLAIMED
    text = first_line(record.get("reason")) or "no reason recorded"
    if outcome == "failed":
        example = first_line(record.get("example") or record.get("case"))
        text = f"{record['implementation']}: {text}" + (f"; example: `{example}`" if example else "")
    label = {"skipped": "n/a"}.get(outcome, LABELS.get(outcome, outcome))
    return f"{label} [{notes.setdefault(text, len(notes) + 1)}]"
