"""The paper's Fig. 6c and Fig. 7 claims, judged on full-scale GPU runs.

Each judge takes one run's rows and returns (holds, evidence), or None when the run lacks the
points the claim needs; the first run with the points decides.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.efficiency.analysis import FIG7_FIT
from reference import paper
from reports.markdown import CONFIRMED, NOT_CONFIRMED, NOT_MEASURED, Claim
from reports.sections.measured import FP16, KITTY, PN_MIX, max_feasible, provenance, runs, slopes

Verdict = tuple[bool, str] | None

TPS = paper.FIG6C_TOKENS_PER_S
FP16_B, PNMIX_B = paper.FIG6B_MAX_BATCH[FP16][0], paper.FIG6B_MAX_BATCH[PN_MIX][0]  # each one's largest batch
#: Fig. 6c's headline, as the paper says it.
PAPER_MAX_THROUGHPUT = (
    f"PN-Mix {TPS[PN_MIX, PNMIX_B]:.1f} tok/s at B = {PNMIX_B}, {paper.FIG6C_MAX_RATIO:.2f}x FP16's "
    f"{TPS[FP16, FP16_B]:.1f} at B = {FP16_B}"
)


def fp16_faster_at_equal_batch(rows: list[dict]) -> Verdict:
    at = {r["method"]: r for r in rows if r["batch"] == FP16_B and not r["oom"]}
    if FP16 not in at or PN_MIX not in at:
        return None
    a, b = at[FP16]["tokens_per_s"], at[PN_MIX]["tokens_per_s"]
    return a > b, f"B = {FP16_B}: FP16 {a:.1f} tok/s, PN-Mix {b:.1f} tok/s"


def pnmix_max_throughput_higher(rows: list[dict]) -> Verdict:
    best = max_feasible(rows)
    if FP16 not in best or PN_MIX not in best:
        return None
    f, p = best[FP16], best[PN_MIX]
    x = p["tokens_per_s"] / f["tokens_per_s"]
    return x > 1, (
        f"PN-Mix {p['tokens_per_s']:.1f} tok/s at B = {p['batch']} vs FP16 {f['tokens_per_s']:.1f} at "
        f"B = {f['batch']}: {x:.2f}x (paper {paper.FIG6C_MAX_RATIO:.2f}x), over the batches measured"
    )


def pnmix_slope_lower(rows: list[dict]) -> Verdict:
    fit = slopes(rows)
    if fit.get(PN_MIX) is None or fit.get(KITTY) is None:
        return None
    p, k = fit[PN_MIX], fit[KITTY]
    return p < k, f"PN-Mix {p:.3f} us/step, Kitty {k:.3f} us/step (PN-Mix {1 - p / k:.1%} lower)"


def pnmix_faster_at_end(rows: list[dict]) -> Verdict:
    both = [s for s in {r["step"] for r in rows} if {PN_MIX, KITTY} <= {r["method"] for r in rows if r["step"] == s}]
    late = [s for s in both if s >= FIG7_FIT[1]]
    if not late:
        return None
    s = max(late)
    p, k = (next(r["step_ms"] for r in rows if r["step"] == s and r["method"] == m) for m in (PN_MIX, KITTY))
    return p < k, f"step {s}: PN-Mix {p:.2f} ms, Kitty {k:.2f} ms (Kitty - PN-Mix = {k - p:+.2f} ms)"


_SLOPE = paper.FIG7_SLOPE_US
_FIT = f"{paper.FIG7_FIT[0] // 1024}K-{paper.FIG7_FIT[1] // 1024}K"
CLAIMS: tuple[tuple[str, str, Callable[[list[dict]], Verdict]], ...] = (
    (
        f"Fig. 6c: at equal batch, FP16 decodes faster than PN-Mix while it fits (B = {FP16_B}: "
        f"{TPS[FP16, FP16_B]:.1f} vs {TPS[PN_MIX, FP16_B]:.1f} tok/s)",
        "fig6c-throughput",
        fp16_faster_at_equal_batch,
    ),
    (
        f"Fig. 6c: PN-Mix's largest feasible throughput exceeds FP16's: {PAPER_MAX_THROUGHPUT}",
        "fig6c-throughput",
        pnmix_max_throughput_higher,
    ),
    (
        f"Fig. 7: PN-Mix's per-step latency grows more slowly than Kitty's over steps {_FIT} ({_SLOPE[PN_MIX]:.2f} vs "
        f"{_SLOPE[KITTY]:.2f} us/step, {paper.FIG7_SLOPE_REDUCTION:.1%} lower)",
        "fig7-latency",
        pnmix_slope_lower,
    ),
    (
        f"Fig. 7: at {paper.FIG7_GENERATION // 1024}K steps PN-Mix decodes a step {paper.FIG7_GAP_AT_END_MS} ms faster "
        "than Kitty",
        "fig7-latency",
        pnmix_faster_at_end,
    ),
)


def judge_all(full: dict[str, list[dict]]) -> list[Claim]:
    """Every claim of CLAIMS on the full-scale rows of each suite."""
    out = []
    for claim, suite, judge in CLAIMS:
        rows = full.get(suite, [])
        for run in runs(rows).values():
            verdict = judge(run)
            if verdict is not None:
                status = CONFIRMED if verdict[0] else NOT_CONFIRMED
                out.append(Claim(claim, status, "measured", verdict[1], provenance(run)))
                break
        else:
            why = "no full-scale GPU results" if not rows else "the GPU results given lack the points it needs"
            out.append(Claim(claim, NOT_MEASURED, "-", why, "-"))
    return out
