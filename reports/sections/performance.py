"""Section 5: measured GPU results (Fig. 6c throughput, Fig. 7 latency, kernel bandwidth), each with
ratio columns against FP16 and Kitty, and the CPU tiny-harness results, labelled as not predictive.
The title names only the figures that have a result."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from benchmarks.efficiency.analysis import FIG7_FIT
from benchmarks.efficiency.workloads import LAUNCH_GRID
from reference import paper
from reports import figures
from reports.inputs import BENCHMARK as BENCH
from reports.inputs import COMPUTED_SUITES, Source, benchmark_problems, benchmarks, of_kind
from reports.markdown import (
    MAX_FIGURES,
    SOURCE,
    Citations,
    Section,
    details,
    escape,
    figure,
    fmt,
    ratio,
    table,
    undrawn,
)
from reports.provenance import quoted
from reports.sections.gpu_claims import PAPER_MAX_THROUGHPUT, judge_all
from reports.sections.measured import (
    FP16,
    KITTY,
    baseline,
    gpu_check_lines,
    is_fp16,
    max_feasible,
    provenance,
    runs,
    slopes,
)

PAPER_WHERE = f"Fig. 6c/7, {paper.EFFICIENCY_SETTING}"
NOT_PREDICTIVE = "CPU tiny harness: checks that the harness runs end to end; not predictive of GPU performance"


# -- Fig. 6c ---------------------------------------------------------------------------------


def throughput_rows(rows: Sequence[dict]) -> list[list]:
    match = ("batch", "prompt", "generation")
    out = []
    for r in sorted(rows, key=lambda r: (r["batch"], r["method"])):
        tps = None if r["oom"] else r["tokens_per_s"]
        out.append(
            [
                r["batch"],
                r["method"],
                r["protocol"],
                "OOM" if r["oom"] else fmt(tps, ".1f"),
                fmt(None if r["oom"] else r["total_s"], ".1f"),
                fmt(ratio(tps, baseline(rows, r, match, FP16, "tokens_per_s")), ".3f"),
                fmt(ratio(tps, baseline(rows, r, match, KITTY, "tokens_per_s")), ".3f"),
                fmt(paper.FIG6C_TOKENS_PER_S.get((r["method"], r["batch"])), ".1f"),
            ]
        )
    return out


def _throughput(rows: list[dict]) -> tuple[str, Callable]:
    best = max_feasible(rows)
    fp16 = next((v["tokens_per_s"] for m, v in best.items() if is_fp16(m)), None)
    kitty = best.get(KITTY, {}).get("tokens_per_s")
    summary = [
        [
            m,
            v["batch"],
            f"{v['tokens_per_s']:.1f}",
            fmt(ratio(v["tokens_per_s"], fp16), ".3f"),
            fmt(ratio(v["tokens_per_s"], kitty), ".3f"),
        ]
        for m, v in sorted(best.items())
    ]
    src = provenance(rows) + f"; paper column {quoted(PAPER_WHERE)}"
    md = "\n".join(
        [
            "#### Fig. 6c: decode throughput vs batch\n",
            table(
                throughput_rows(rows),
                ["batch", "method", "protocol", "tok/s", "total s", "tok/s / FP16", "tok/s / Kitty", "paper tok/s"],
                src,
            ),
            f"Largest throughput each method reaches over the batches that fit (the paper: {PAPER_MAX_THROUGHPUT}):\n",
            table(summary, ["method", "at batch", "max tok/s", "/ FP16 max", "/ Kitty max"], provenance(rows)),
        ]
    )

    def draw(ax):
        for m in sorted({r["method"] for r in rows}):
            pts = sorted((r["batch"], r["tokens_per_s"]) for r in rows if r["method"] == m and not r["oom"])
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=figures.color(m), label=f"{m} (measured)")
        # the paper's points where the table shows them (same method and batch), as the paper's device's
        shown = {(r["method"], r["batch"]) for r in rows}
        for m in sorted({m for m, _ in paper.FIG6C_TOKENS_PER_S}):
            pts = sorted((b, v) for (pm, b), v in paper.FIG6C_TOKENS_PER_S.items() if pm == m and (m, b) in shown)
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    marker="*",
                    ms=12,
                    ls="",
                    color=figures.color(m),
                    mec="k",
                    label=f"{m} (paper, {paper.GPU}, quoted)",
                )
        title = f"Fig. 6c: throughput vs batch (measured: {rows[0]['device']}; stars: the paper's {paper.GPU})"
        ax.set(xlabel="batch B", ylabel="tokens / s", title=title)

    return md, functools.partial(figures.png, draw)


# -- Fig. 7 ----------------------------------------------------------------------------------


def _latency(rows: list[dict]) -> tuple[str, Callable]:
    fit = slopes(rows)
    fp16 = next((v for m, v in fit.items() if is_fp16(m)), None)
    last = max(r["step"] for r in rows)
    at_last = {r["method"]: r["step_ms"] for r in rows if r["step"] == last}
    fp16_last = next((v for m, v in at_last.items() if is_fp16(m)), None)
    summary = [
        [
            m,
            fmt(s, ".3f", "n/a: < 2 steps in window"),
            fmt(ratio(s, fp16), ".3f"),
            fmt(ratio(s, fit.get(KITTY)), ".3f"),
            fmt(paper.FIG7_SLOPE_US.get(m), ".2f"),
            fmt(at_last.get(m), ".2f"),
            fmt(ratio(at_last.get(m), fp16_last), ".3f"),
            fmt(ratio(at_last.get(m), at_last.get(KITTY)), ".3f"),
        ]
        for m, s in fit.items()
    ]
    steps = sorted({r["step"] for r in rows})
    methods = sorted(fit)
    points = [
        [
            s,
            *(
                fmt(next((r["step_ms"] for r in rows if r["step"] == s and r["method"] == m), None), ".3f")
                for m in methods
            ),
        ]
        for s in steps
    ]
    src = provenance(rows)
    md = "\n".join(
        [
            f"#### Fig. 7: decode latency per step (B = 1), slope over steps {FIG7_FIT[0]}-{FIG7_FIT[1]} "
            f"({FIG7_FIT[0] // 1024}K-{FIG7_FIT[1] // 1024}K)\n",
            table(
                summary,
                [
                    "method",
                    "slope us/step",
                    "slope / FP16",
                    "slope / Kitty",
                    "paper us/step",
                    f"ms at step {last}",
                    "/ FP16",
                    "/ Kitty",
                ],
                src + "; slope computed by benchmarks.efficiency.analysis.latency_slope_us (least squares over the "
                "window); "
                f"paper column {quoted(PAPER_WHERE)}",
            ),
            details("Every timed step (ms)", table(points, ["step", *methods], src)),
        ]
    )

    def draw(ax):
        for m in methods:
            pts = sorted((r["step"], r["step_ms"]) for r in rows if r["method"] == m)
            ax.plot(
                *zip(*pts, strict=True),
                marker="o",
                color=figures.color(m),
                label=f"{m}" + (f" ({fit[m]:.2f} us/step)" if fit[m] is not None else ""),
            )
        ax.axvspan(*FIG7_FIT, alpha=0.08, color="k", label="slope window")
        ax.set(xlabel="decode step t", ylabel="ms per step", title=f"Fig. 7: decode latency, {rows[0]['device']}")

    return md, functools.partial(figures.png, draw)


# -- kernel ----------------------------------------------------------------------------------


def kernel_rows(rows: Sequence[dict]) -> list[list]:
    match = ("batch", "context")
    return [
        [
            r["batch"],
            r["context"],
            r["method"],
            "OOM" if r.get("oom") else fmt(r["ms"], ".4g"),
            fmt(r.get("roofline_ms"), ".4g"),
            fmt(r["gbps"], ".4g"),
            fmt(r["fraction_of_copy"], ".3f"),
            fmt(ratio(r["ms"], baseline(rows, r, match, FP16, "ms")), ".3f"),
            fmt(ratio(r["ms"], baseline(rows, r, match, KITTY, "ms")), ".3f"),
        ]
        for r in sorted(rows, key=lambda r: (r["batch"], r["context"], r["method"]))
    ]


def _kernel(rows: list[dict]) -> tuple[str, Callable]:
    copy = rows[0]["copy_gbps"]
    md = "\n".join(
        [
            f"#### Decode attention kernel: bandwidth against the device's copy bandwidth ({copy:.0f} GB/s)\n",
            "GB/s = bytes the method must read (packed keys and values, scales, zeros, metadata, sinks, residual) "
            "/ time; fraction of copy = GB/s / copy bandwidth (1.0 is the roofline); roofline ms = those bytes at "
            "copy bandwidth.\n",
            table(
                kernel_rows(rows),
                [
                    "batch",
                    "context",
                    "method",
                    "ms",
                    "roofline ms",
                    "GB/s",
                    "fraction of copy",
                    "ms / FP16",
                    "ms / Kitty",
                ],
                provenance(rows),
            ),
        ]
    )
    batches = sorted({r["batch"] for r in rows})

    def draw(*axes):
        for ax, b in zip(axes, batches, strict=True):
            for m in sorted({r["method"] for r in rows}):
                pts = sorted(
                    (r["context"], r["gbps"]) for r in rows if r["batch"] == b and r["method"] == m and not r.get("oom")
                )
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", color=figures.color(m), label=m)
            ax.axhline(copy, color="k", ls="--", lw=1, label="copy bandwidth (roofline)")
            ax.set_xscale("log", base=2)
            ax.set(xlabel="context (tokens)", ylabel="GB/s", title=f"decode attention, B = {b}")

    return md, functools.partial(figures.png, draw, ncols=len(batches), size=(5.0, 4.0))


# -- launch choices --------------------------------------------------------------------------


def launch_rows(rows: Sequence[dict]) -> list[list]:
    """One row per launch choice, timed against the package's default choice (`LAUNCH_GRID[0]`) where it ran."""
    choice = lambda r: (r["block_n"], r["warps"], r["stages"], r["split_factor"])  # noqa: E731
    default = next((r for r in rows if choice(r) == LAUNCH_GRID[0]), None)
    out = []
    for r in sorted(rows, key=lambda r: choice(r) != LAUNCH_GRID[0]):
        fits = "OOM" if r.get("oom") else "yes" if r["fits"] else "no"
        error = "-"
        if r.get("max_error") is not None:
            verdict = "within" if r["max_error"] <= r["error_bound"] else "ABOVE"
            error = f"{r['max_error']:.3g} ({verdict} {r['error_bound']:.3g})"
        out.append(
            [
                r["block_n"],
                r["warps"],
                r["stages"],
                r.get("splits", "-"),
                fits,
                fmt(r["ms"], ".4g"),
                fmt(r["fraction_of_copy"], ".3f"),
                fmt(ratio(r["ms"], default["ms"]) if default else None, ".3f"),
                error,
            ]
        )
    return out


def _launch(rows: list[dict]) -> tuple[str, None]:
    r0 = rows[0]
    md = "\n".join(
        [
            f"#### Decode kernel launch choices (PN-Mix, B = {r0['batch']}, {r0['context']} tokens)\n",
            "The kernel table's PN-Mix point at each launch choice of "
            "`benchmarks.efficiency.workloads.LAUNCH_GRID`: tile "
            "(block_n), warps, pipeline stages, splits; ms / default = time against the package's default choice "
            "(the first row); error against the float64 oracle over the cache, judged by property 7's rule.\n",
            table(
                launch_rows(rows),
                ["block_n", "warps", "stages", "splits", "fits", "ms", "fraction of copy", "ms / default", "error"],
                provenance(rows),
            ),
        ]
    )
    return md, None


def _ptx(rows: list[dict]) -> tuple[str, None]:
    """The decode kernel with and without the PTX unpack of its value codes: which path each launch took."""
    body = [
        [
            r["method"],
            r["batch"],
            r["context"],
            r["ptx_path"],
            escape(r["self_test"]),
            "yes" if r["identical"] else "no",
            fmt(r["plain_ms"], ".4g"),
            fmt(r["ptx_ms"], ".4g"),
            fmt(ratio(r["ptx_ms"], r["plain_ms"]), ".3f"),
            f"{fmt(r['plain_max_error'], '.3g')} / {fmt(r['ptx_max_error'], '.3g')} "
            f"(bound {fmt(r['error_bound'], '.3g')})",
        ]
        for r in rows
    ]
    heads = [
        "method",
        "B",
        "context",
        "path asked PTX took",
        "why",
        "bit-identical",
        "plain ms",
        "PTX ms",
        "PTX / plain",
    ]
    md = "\n".join(
        [
            "#### Decode kernel with the PTX unpack of its value codes (`PNMIX_PTX_UNPACK`)\n",
            "The same launch with the switch off and on; the path a launch asking for PTX took, and why (the "
            "first-use self-test decides per device); errors of each path against the float64 oracle over the "
            "cache, with property 7's bound.\n",
            table(body, [*heads, "error plain / PTX"], provenance(rows)),
        ]
    )
    return md, None


def _fragment(rows: list[dict]) -> tuple[str, None]:
    """The fragment-order decode loop in the form the package launches: the path its self-test chose (and why),
    its splits and merge form, its time and its share of the copy bandwidth; "off" without a CUDA device."""
    body = [
        [
            r["method"],
            r["batch"],
            r["context"],
            r["path"],
            escape(r["self_test"]),
            r.get("splits", "-"),
            r.get("merge", "-"),
            fmt(r.get("ms"), ".4g"),
            fmt(r.get("fraction_of_copy"), ".3f"),
        ]
        for r in rows
    ]
    heads = ["method", "B", "context", "path", "why", "splits", "merge", "ms", "of copy bandwidth"]
    md = "\n".join(
        [
            "#### Fragment-order decode loop (`benchmarks/suites/test_fragment_design.py`)\n",
            "The loop `PNMixCache` decodes with on a GPU that passes its first-use self-test, launched as the package "
            "launches it (its splits, and its merge in the loop or in the merge kernel); where no CUDA device is "
            "there it does not run, and says so.\n",
            table(body, heads, provenance(rows)),
        ]
    )
    return md, None


# -- the section -----------------------------------------------------------------------------

#: The evaluation path's target: every method within this factor of FP16's time through the same path.
EVAL_SPEED_TARGET = 1.25


def _eval_speed(rows: list[dict]) -> tuple[str, None]:
    """Seconds per item and per generation of each method, and the ratio to FP16 through the same path."""
    points = sorted({(r["work"], r["length"]) for r in rows})
    methods_ = list(dict.fromkeys(r["method"] for r in rows))
    table_rows = []
    for m in methods_:
        row = [m]
        for work, length in points:
            mine = next((r for r in rows if (r["method"], r["work"], r["length"]) == (m, work, length)), None)
            fp16 = next((r for r in rows if (r["method"], r["work"], r["length"]) == (FP16, work, length)), None)
            seconds = None if mine is None else mine["seconds"]
            if mine is not None and "fp16_seconds" in mine:  # FP16 timed beside it, in the same test
                x = ratio(seconds, mine["fp16_seconds"])
            else:
                x = ratio(seconds, None if fp16 is None else fp16["seconds"])
            row.append("-" if seconds is None else f"{seconds:.3g} s ({fmt(x, '.2f')}x)")
        table_rows.append(row)
    heads = ["method", *(f"{work}, {length} tokens" for work, length in points)]
    intro = (
        "Evaluation speed through each method's cache (the path of the accuracy, long-output and fidelity "
        f"results), one CPU thread; in brackets the ratio to FP16 through the same path (target: within "
        f"{EVAL_SPEED_TARGET}x; FP16 timed beside each method in the same test where the file has it, so that "
        'a machine whose speed drifts over the run moves both alike); "model\'s own" is the model with its own '
        "attention and cache, for scale. "
        "An item: the prompt, a decode section, four candidates scored from a checkpoint "
        "(`benchmarks/suites/test_eval_speed.py`).\n\n"
    )
    return intro + table(table_rows, heads, provenance(rows)), None


RENDERERS: dict[str, tuple[str, Callable]] = {
    "fig6c-throughput": ("fig6c-throughput", _throughput),
    "fig7-latency": ("fig7-latency", _latency),
    "kernel": ("kernel-bandwidth", _kernel),
    "kernel-launch": ("kernel-launch", _launch),
    "kernel-ptx": ("kernel-ptx", _ptx),
    "kernel-fragment": ("kernel-fragment", _fragment),
    "eval-speed": ("eval-speed", _eval_speed),
}
#: What a pytest-benchmark round timed (`reports.inputs.usable`'s "timed").
TIMED = {"steps": "a step", "point": "the point"}
TINY_FIGURE = {
    "fig6-memory": ("model peak GiB", "model_peak_gib"),
    "fig6c-throughput": ("tok/s", "tokens_per_s"),
    "fig7-latency": ("step ms", "step_ms"),
    "kernel": ("ms", "ms"),
    "kernel-launch": ("ms", "ms"),
    "kernel-ptx": ("PTX-switch ms", "ptx_ms"),
    "kernel-fragment": ("ms", "ms"),
}
POINT_KEYS = ("batch", "prompt", "generation", "step", "context")
#: The figures a GPU result gives, named in the section's title only when there is one.
TITLES = {
    "fig6c-throughput": "Fig. 6c",
    "fig7-latency": "Fig. 7",
    "kernel": "kernel bandwidth",
    "eval-speed": "evaluation speed",
}
#: Suites measured on the CPU at full scale: no GPU result.
CPU_SUITES = ("eval-speed",)


def _ms(seconds: float | None) -> str:
    return fmt(seconds * 1e3 if seconds is not None else None, ".4g")


def _point(e: dict) -> str:
    return ", ".join(f"{k} {e[k]}" for k in POINT_KEYS if e.get(k) is not None)


def _rounds(e: dict) -> str:
    """The wall time's spread over the rounds of its own run: min-max, or that one round measured none."""
    rounds, low, high = e.get("rounds"), e.get("wall_min_s"), e.get("wall_max_s")
    if not isinstance(rounds, int) or rounds < 2 or low is None or high is None:
        return "none measured (1 round)" if rounds == 1 else "-"
    return f"{_ms(low)}-{_ms(high)} ({rounds} rounds)"


def _across(entries: list[dict]) -> dict[tuple, tuple[float, int]]:
    """(suite, method, point) -> (slowest / fastest median wall time, runs) where several runs timed it."""
    times: dict[tuple, list[float]] = {}
    for e in entries:
        if e.get("wall_median_s"):
            times.setdefault((e["suite"], e["method"], _point(e)), []).append(e["wall_median_s"])
    return {k: (max(v) / min(v), len(v)) for k, v in times.items() if len(v) > 1}


def _varied(spread: tuple[float, int] | None) -> str:
    return f"{spread[0]:.2f}x over {spread[1]} runs" if spread else "-"


def _tiny(entries: list[dict]) -> str:
    across = _across(entries)
    rows = [
        [
            e["suite"],
            e["method"],
            _point(e),
            TINY_FIGURE[e["suite"]][0],
            fmt(e.get(TINY_FIGURE[e["suite"]][1]), ".4g"),
            _ms(e.get("wall_median_s")),
            TIMED[e.get("timed", "point")],
            _rounds(e),
            _varied(across.get((e["suite"], e["method"], _point(e)))),
        ]
        for e in entries
    ]
    src = "; ".join(provenance(group) for group in runs(entries).values())
    widest = max(across.items(), key=lambda kv: kv[1][0], default=None)
    one = sum(e.get("rounds") == 1 for e in entries)
    spread = (
        f" Across the runs given here the same point's median varied up to {widest[1][0]:.2f}x "
        f"({escape(widest[0][1])}, {widest[0][0]}, {escape(widest[0][2])})."
        if widest
        else ""
    )
    note = (
        "No method is ranked on these timings: they are CPU wall times of tiny models, on a machine that may be "
        f"shared with other work, where a point's time can vary several-fold between runs; {one} of "
        f"{len(entries)} points ran one round (no spread measured within the run)." + spread + " wall ms: "
        "pytest-benchmark's median "
        "over the point's rounds; timed: what a round timed (one decode step or one kernel call, where the suite "
        "times the figure's calls; else the whole point: building, filling and every timed call); rounds: its "
        "min-max over them; "
        "across runs: the slowest over the fastest median of the same point in the runs given.\n"
    )
    heads = ["suite", "method", "point", "figure", "value", "wall ms", "timed", "rounds", "across runs"]
    return note + "\n" + table(rows, heads, src)


def render(sources: Sequence[Source]) -> Section:
    full = {suite: benchmarks(sources, suite, "full") for suite in RENDERERS}
    checks = of_kind(sources, "gpu-check")
    parts, figs = [], {}
    gpu = {suite: rows for suite, rows in full.items() if suite not in CPU_SUITES}
    if not any(gpu.values()):
        parts.append(
            "**No GPU results.** No full-scale benchmark or GPU-check results were run here or given "
            "(`--input`), so Fig. 6c, Fig. 7 and the kernel bandwidth are not measured in this report. "
            "Run `pytest benchmarks/suites --benchmark-only --benchmark-json PATH` and "
            "`python -m benchmarks.gpu_check` on a CUDA machine and pass the files with `--input`.\n"
        )
    every = [r for rows in full.values() for r in rows]
    skipped = 0
    for n, ((name, device), run) in enumerate(runs(every).items()):
        parts.append(escape(f"### {device}: `{name}`") + "\n")
        for suite, (prefix, render_suite) in RENDERERS.items():
            rows = [r for r in run if r["suite"] == suite]
            if not rows:
                continue
            md, drawing = render_suite(rows)  # its table, and its figure to draw (None: it has none)
            parts.append(md)
            room = len(figs) < MAX_FIGURES
            png = drawing() if drawing is not None and room else None
            skipped += drawing is not None and not room
            if png is not None:
                figs[f"{prefix}-{n + 1}.png"] = png
                parts.append(figure(f"{prefix}-{n + 1}.png", f"{suite}, {device} (measured)"))
    parts.append(undrawn(skipped, "tables"))
    for s in checks:
        parts += [line + "\n" for line in gpu_check_lines(s)]
    tiny = benchmarks(sources, scale="tiny")
    parts.append(f"### {NOT_PREDICTIVE}\n")
    parts.append(_tiny(tiny) if tiny else "No tiny-harness results were run or given.\n")
    suites = {(b.get("extra_info") or {}).get("suite") for s in of_kind(sources, BENCH) for b in s.data["benchmarks"]}
    computed_here = suites & set(COMPUTED_SUITES)
    parts += [f"The `{s}` benchmark is computed, not measured: {COMPUTED_SUITES[s]}.\n" for s in sorted(computed_here)]
    problems = [f"`{s.name}`: {p}" for s in of_kind(sources, BENCH) for p in benchmark_problems(s.data)]
    if problems:
        parts.append(
            "Benchmarks not used here (outside the schema this report reads):\n\n"
            + "\n".join(f"- {escape(p)}" for p in problems)
            + "\n"
        )
    shown = [label for suite, label in TITLES.items() if full.get(suite)]
    title = "Measured performance" + (f" ({', '.join(shown)})" if shown else "")
    return Section(title, cited("\n".join(parts)), figs, judge_all(gpu))


def cited(md: str) -> str:
    """Each table's full source said once, in a list at the top, and cited under the tables by label."""
    cites = Citations("P")
    lines = [
        SOURCE + cites.cite(line.removeprefix(SOURCE)) if line.startswith(SOURCE) else line for line in md.splitlines()
    ]
    return cites.legend() + "\n" + "\n".join(lines) + "\n"
