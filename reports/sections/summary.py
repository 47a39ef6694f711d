"""The first screen: one row per implementation, with what decides between them.

Verdict (conforms, or the failing properties by name), the storage section's count of the configuration
each ran (the one number a configuration has in the report), attention error on the conformance suite's
realistic workload (`conformance.strategies.REALISTIC`: thousands of tokens), and decode speed against
FP16 where a GPU ran the kernel benchmark. Only current results enter (`reports.currency`); every
column says where it comes from.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from conformance.strategies import REALISTIC, REALISTIC_TOKENS, describe
from reference import PNMixConfig, methods, records
from reference.tokens.config import TokenPrecisionConfig
from reports import currency
from reports.inputs import Source, benchmarks
from reports.markdown import Section, escape, fmt, table
from reports.markdown import details as folded
from reports.sections import conformance as matrix
from reports.sections import storage
from reports.sections.measured import is_fp16

#: What the conformance suite records on its realistic workload (conformance/test_p8_storage.py, p7).
ERROR = "realistic_attention_error"
#: The benchmark the speed column reads: decode attention of one layer at the paper's scale.
SPEED_SUITE = "kernel"


@dataclasses.dataclass(frozen=True)
class Ran:
    """The realistic workload a conformance record ran: its description, its configuration (read from the
    record's data, `reference.records.config_from_record`; None where the record has none this tree reads) and,
    for a per-token one, the chance that a token is low."""

    description: str
    config: PNMixConfig | TokenPrecisionConfig | None
    low_share: float | None = None

    @property
    def share(self) -> float:
        """The share of low tokens its bits are counted at (the suite's workload's, where it recorded none)."""
        return REALISTIC_TOKENS.low_share if self.low_share is None else self.low_share


def ran(record: dict) -> Ran | None:
    """What a conformance record says it ran on the realistic workload (None for a record of another property)."""
    m = record.get("measured") or {}
    if not isinstance(m.get("realistic_workload"), str):
        return None
    try:
        config = records.config_from_record(m["realistic_config"]) if "realistic_config" in m else None
    except ValueError:  # a configuration of other code: not read as one of this tree's
        config = None
    share = m.get("realistic_low_share")
    return Ran(m["realistic_workload"], config, share if isinstance(share, (int, float)) else None)


def counted(workload: Ran | None) -> float | None:
    """The storage section's count of the configuration a realistic-workload record ran (its share of low
    tokens for a per-token one); None where no configuration reads."""
    if workload is None or workload.config is None:
        return None
    return storage.count(workload.config, workload.share)[0]


def _bits(workload: Ran | None, records: Sequence[dict]) -> str:
    """The storage section's count of the configuration as run; where none reads, the bits it held (measured)."""
    if workload is not None and workload.config is not None:
        return storage.count_text(workload.config, workload.share)
    held = matrix.held_bits(records)
    return "-" if held == "-" else f"{held} held on the test workload (measured)"


def _brief_bits(workload: Ran | None, records: Sequence[dict]) -> str:
    """`_bits` as one number: '2.26', or '2.70 held (measured)' where no configuration reads."""
    count = counted(workload)
    if count is not None:
        return f"{count:.2f}"
    held = matrix.largest(records, matrix.HELD_BITS)
    return "-" if held is None else f"{held:.2f} held (measured)"


def speed_rows(entries: Sequence[dict]) -> dict[str, list[tuple[dict, float]]]:
    """implementation -> [(its kernel point, time / FP16's time at the same point, same file and device)]."""

    def point(e: dict) -> tuple:
        return id(e["source"]), e["device"], e["batch"], e["context"]

    # FP16's first timed entry at each point, found once (not by a scan of every entry per entry)
    fp16: dict[tuple, dict] = {}
    for f in entries:
        if is_fp16(f["method"]) and f.get("ms"):
            fp16.setdefault(point(f), f)
    out: dict[str, list[tuple[dict, float]]] = collections.defaultdict(list)
    for e in entries:
        impl = e.get("implementation")
        if impl is None or is_fp16(e["method"]) or e.get("oom") or e.get("ms") is None:
            continue
        base = fp16.get(point(e))
        if base is not None:
            out[impl].append((e, e["ms"] / base["ms"]))
    return out


def speed_text(points: list[tuple[dict, float]]) -> str:
    if not points:
        return "no GPU result"
    e, r = max(points, key=lambda p: (p[0]["context"], -p[0]["batch"]))
    return f"{r:.2f}x FP16's time (B = {e['batch']}, {e['context']} tokens, {matrix.device_label(e['device'])})"


#: The heading of the table that gives each implementation's verdict in full and what it ran.
FULL = "Each implementation in full"


def brief(records: Sequence[dict]) -> str:
    """An implementation's verdict on one device in a few words: 'conforms', 'conforms except 26 listed
    differences', 'FAILS P7, P3' (`conformance.verdict` says it in full)."""
    return matrix.verdict(records, brief=True)


def config_label(config: PNMixConfig | TokenPrecisionConfig) -> str:
    """A configuration as the summary names it: 'K H3(50%)L1, V 2-bit, G 128, 32 sinks'."""
    if isinstance(config, TokenPrecisionConfig):
        keys = ", low keys by pairs" if config.low_keys == "pairs" else ""
        return f"K and V INT{config.high_bits} or INT{config.low_bits} per token, G {config.group_size}{keys}"
    high, low, ratio = config.b_high, config.b_low, config.ratio
    if config.n_sink >= 2**31 and config.value_bits >= 16:  # every token a sink: nothing is quantized
        return "K exact, V exact (every token kept)"
    uniform = high == low or not ratio
    keys = f"K {high}-bit" if uniform else f"K H{high}({ratio:.0%})L{low}"
    if 1 in ((high,) if uniform else (high, low)) and config.one_bit != ("ends" if uniform else "midpoint"):
        # said only where it is not the usual one: uniform (KIVI) 1-bit keys at group ends, mixed at midpoints
        keys += " (1-bit at Eq. 7 midpoints)" if config.one_bit == "midpoint" else " (1-bit at group ends)"
    values = "V exact" if config.value_bits >= 16 else f"V {config.value_bits}-bit"
    sinks = config.n_sink
    return f"{keys}, {values}, G {config.group_size}" + (f", {sinks} sinks" if 0 < sinks < 2**31 else "")


def as_run(workload: Ran | None) -> str:
    """The keys and values of the configuration an implementation ran the workload with ('-' where
    none reads): 'K H2L2, V 2-bit'."""
    return "-" if workload is None or workload.config is None else config_label(workload.config)


def registry_method(config: PNMixConfig | TokenPrecisionConfig) -> str | None:
    """The method of the registry (`reference.methods`, as the storage section names them) whose
    configuration this is, its scale dtype and pair layout aside; None where none is."""
    family = methods.TOKENS if isinstance(config, TokenPrecisionConfig) else methods.CHANNELS
    for name in methods.names(precision=family):
        own = methods.config(name)
        if dataclasses.replace(own, scale_dtype=config.scale_dtype, pair_layout=config.pair_layout) == config:
            return name
    return None


def design_of(implementation: str) -> str | None:
    """The design whose spec or Triton implementation this is (None for a plug-in)."""
    return next((d.name for d in methods.DESIGNS.values() if implementation in (d.spec, d.triton)), None)


def method_as_run(implementation: str, workloads: Sequence[Ran], details: dict | None) -> str:
    """What an implementation ran, named as the storage section names methods where it is one of them;
    otherwise its configuration, and how the workload's configuration was mapped onto it (its preset,
    its claims) with the methods of its design it is not."""
    out = []
    for workload in sorted(workloads, key=lambda w: w.description):
        config = workload.config
        if config is None:
            continue
        label, method = config_label(config), registry_method(config)
        low = "" if workload.low_share is None else f"; {workload.low_share:.0%} of tokens drawn low"
        if method is not None:
            out.append(f"{method} ({label}{low})")
            continue
        preset = ((details or {}).get("claims") or {}).get("preset")
        design = design_of(implementation)
        how = f"mapped by its preset `{preset}` and fitted to its claims" if preset else "fitted to its claims"
        mine = methods.names(design=design) if design else ()
        other = f"; not {design} as the storage section defines it ({', '.join(mine)})" if mine else ""
        out.append(f"{label}{low}: no method of the storage section; PN-Mix's configuration {how}{other}")
    return "; ".join(out) or "-"


def attention_note(details: dict | None) -> str:
    """What an implementation claimed of its attention where it is not its own (`Capabilities.attention`)."""
    if ((details or {}).get("claims") or {}).get("attention") == "spec":
        return "; attention judged: the spec's float32 attention over its cache, not its own arithmetic"
    return ""


def render(
    conformance: Sequence[Source], sources: Sequence[Source], history: int, by_method: str = "", gpu: str = ""
) -> Section:
    """Page 1: the verdicts' lead, `gpu` (what GPU evidence exists, `reports.sections.gpu_evidence`), the
    per-implementation table, then `by_method` (the table by method, `reports.sections.by_method`), both
    rendered by the caller (they read this module's labels), then the History line."""
    columns = matrix.records_by_column(conformance)
    by_impl: dict[str, dict[str, list[dict]]] = collections.defaultdict(dict)
    for (name, device), recs in columns.items():
        by_impl[name][device] = recs
    details = matrix.details_of(conformance)
    speeds = speed_rows(benchmarks(sources, SPEED_SUITE, "full"))
    # a plug-in is benchmarked under the name it was given (an import path), checked under its own
    aliases = {d.get("origin"): name for name, d in details.items() if d.get("origin") in speeds}
    for alias, name in aliases.items():
        speeds[name] = speeds.get(name, []) + speeds.pop(alias)
    rows, full = [], []
    for name in matrix.order(set(by_impl) | set(speeds)):
        devices = by_impl.get(name, {})
        verdicts = [
            (f"{dev}: " if len(devices) > 1 else "") + matrix.verdict(recs) for dev, recs in sorted(devices.items())
        ]
        every = [r for recs in devices.values() for r in recs]
        # an implementation of both families (the spec) ran two workloads: a figure for each, in the label's order
        by_workload: dict[Ran | None, list[dict]] = collections.defaultdict(list)
        for r in every:
            by_workload[ran(r)].append(r)
        workloads = sorted(by_workload.keys() - {None}, key=lambda w: w.description)
        figures = workloads or [None]  # a record naming no workload still has figures
        named = f"{name} {details[name]['version']}" if name in details else name
        rows.append(
            [
                named,
                "; ".join(
                    (f"{dev}: " if len(devices) > 1 else "") + brief(recs) for dev, recs in sorted(devices.items())
                )
                or "not checked here",
                "; ".join(_brief_bits(w, by_workload[w]) for w in figures),
                "; ".join(fmt(matrix.largest(by_workload[w], ERROR), ".3g") for w in figures),
                speed_text(speeds.get(name, [])),
            ]
        )
        full.append(
            [
                named,
                ("; ".join(verdicts) or "not checked here") + attention_note(details.get(name)),
                method_as_run(name, workloads, details.get(name)),
                "; ".join(_bits(w, by_workload[w]) for w in figures),
            ]
        )
    files = sorted({s.name for s in conformance})
    bench_files = sorted({e["source"].name for pts in speeds.values() for e, _ in pts})
    source = (
        f"bits computed ({storage.COUNT_RULE}, `reports.sections.storage.count`); verdict and error measured by "
        "the conformance runs "
        + (", ".join(f"`{f}`" for f in files) or "(none)")
        + "; speed measured by "
        + (", ".join(f"`{f}`" for f in bench_files) or "no GPU benchmark of the current code")
        + " (devices, dates and commands: the list of result files)"
    )
    workload = describe(REALISTIC)
    explained = (
        "verdict: conforms, conforms except the differences its implementer listed (section 2 gives them), or the "
        "failing properties. bits: the storage section's count of the configuration each ran (the table below "
        "gives keys and values apart). attention error: the largest absolute difference of its decode attention "
        "from float64 attention over the exact tokens, on the conformance suite's realistic workload "
        f"(`conformance.strategies.REALISTIC`: {workload}; per-token caches: the same tokens and shapes, "
        f"`conformance.strategies.REALISTIC_TOKENS`, each token low with chance {REALISTIC_TOKENS.low_share:.0%}). "
        "decode speed: its decode-attention time over FP16 SDPA's at the same point of the same run (lower is "
        "faster), at the largest context measured on a GPU; CPU timings are not shown here (they predict nothing "
        "about a GPU).\n"
    )
    ran_note = (
        "method as run: what each implementation ran the workload with. It starts from the paper's configuration "
        "(PN-Mix's H3(50%)L1, G 128, 32 sinks, 2-bit values; per-token caches: their own); a design's preset "
        "maps it onto that design and its claims pick the nearest bits, groups and sinks it has. Where the "
        "result is a method of the storage section it is named so (as that section counts its bits); otherwise "
        "the configuration is given, marked as no method of the storage section, with the methods of its "
        "design it is not: a row named KIVI or Kitty there is that design at PN-Mix's configuration, not the "
        "KIVI or Kitty the storage, memory and claims sections compare. "
        f"bits: the storage section's count of the method as run ({storage.COUNT_RULE}), the one number each "
        "configuration has in this report; what each implementation measurably held on the test workload, "
        "residual and sinks included, is in the conformance section.\n"
    )
    parts = [
        _lead(by_impl, rows),
        gpu,
        _contradicting(sources),
        table(rows, ["implementation", "verdict", "bits / element", "attention error", "decode speed"], source),
        explained,
        folded(
            FULL,
            FULL
            + ":\n\n"
            + table(full, ["implementation", "verdict", "method as run", storage.COUNT_NAME], source)
            + "\n"
            + ran_note,
        ),
    ]
    if by_method:
        parts.append(folded("every configuration a task-accuracy result ran, by method", by_method))
    if history:
        parts.append(
            f"{history} result file(s) measured code that differs from this tree's, or were refused (their numbers "
            "are not what their own outcomes give); they are left out of every comparison and listed under History.\n"
        )
    return Section("Summary", "\n".join(p for p in parts if p))


def _contradicting(sources: Sequence[Source]) -> str:
    """Current results that cannot both be right (`reports.currency.contradictions`), said before anything
    is compared: every comparison below uses both."""
    found = currency.contradictions(sources)
    if not found:
        return ""
    head = (
        "**Contradicting results**: a result file is evidence as given, not signed, and these measured the same "
        "thing with different outcomes; the sections below show both. Which is right cannot be told from the "
        "files: run it again.\n\n"
    )
    return head + "\n".join(f"- {escape(line)}" for line in found) + "\n"


def _most_counted(devices: dict[str, list[dict]]) -> tuple[float, Ran] | None:
    """The largest storage-section count among the configurations an implementation ran the realistic
    workload with (an implementation of both families ran two), with that workload."""
    workloads = {ran(r) for recs in devices.values() for r in recs} - {None}
    counts = [(b, w) for w in workloads if (b := counted(w)) is not None]
    return max(counts, default=None, key=lambda c: (c[0], c[1].description))


def _lead(by_impl: dict[str, dict[str, list[dict]]], rows: list[list]) -> str:
    """Which implementations conform, which fail, and which store the fewest bits, in two sentences."""
    if not by_impl:
        return "No current conformance results: no verdict can be given.\n"
    failing = [
        n for n, devs in by_impl.items() if any(r["outcome"] in matrix.BREAKING for recs in devs.values() for r in recs)
    ]
    conforming = [n for n in by_impl if n not in failing]
    out = [f"Conform: {', '.join(conforming) or 'none'}.", f"Fail: {', '.join(failing) or 'none'}."]
    listed = {
        n: sum(r["outcome"] == "xfailed" for recs in by_impl[n].values() for r in recs) for n in conforming
    }  # known differences, listed in its xfails file: it conforms except for them
    bits = {n: _most_counted(by_impl[n]) for n in conforming if not listed[n]}
    bits = {n: (round(b[0], 2), b[1]) for n, b in bits.items() if b is not None}  # equal as printed are equal
    if bits:
        fewest = min(b for b, _ in bits.values())
        named = [f"{n} as run ({as_run(d)})" for n, (b, d) in bits.items() if b == fewest]
        out.append(
            "Fewest bits per element (the storage section's count) among those that conform with no listed "
            f"difference: {', '.join(named)}, {fewest:.2f}."
        )
    excepted = [f"{n} ({k})" for n, k in listed.items() if k]
    if excepted:
        out.append(f"Conforming except listed differences (not counted for the fewest bits): {', '.join(excepted)}.")
    return escape(" ".join(out)) + "\n"
