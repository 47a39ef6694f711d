"""One command for a GPU session: compiled conformance of the Triton implementation, then the
benchmark suites, with every result kept under benchmarks/results/.

    python -m benchmarks.gpu_check --short [--steps NAME ...] [--time-budget S] [--out DIR]
                                   [--tiny] [--budget-gib 40]
    python -m benchmarks.gpu_check [--out DIR] [--sweep short|all] [--suites NAME ...]
                                   [--skip-conformance] [--tiny] [--budget-gib 40]

--short fits a 15-minute lease on a cold machine with room for a rerun: 360 s in all (--time-budget), start-up of
each step and Triton's compilation included. Each step is its own pytest process with a time budget, interrupted at
its budget (pytest still writes what it finished) and skipped when less than its budget is left of --time-budget.
The default steps' budgets and `OVERHEAD_S` for gpu_check itself (the dry run below, the records) sum to 360 s.
Each runs only its points, so Triton compiles only the kernels they launch. Before the first step a dry run
(`benchmarks.commands.specializations`: the steps' work on the CPU, launches recorded for this GPU, not run) counts
the kernel specializations each step will compile (those an earlier step compiled left out); each step prints
its count and the compile time that count is estimated to take (`SECONDS_PER_SPECIALIZATION`, measured with
`python -m pnmix.aot`: an estimate), and its record keeps both.
  fragment (30 s): the fragment-order path (`pnmix.kernels.fragment_attention`, what PNMixCache decodes with in
      float16 where the loop passed its self-test; benchmarks/suites/test_fragment_design.py): the loop's self-test
      on this device (`pnmix.kernels.fragment_check`: the path it takes, inline PTX, plain or off, in its own words),
      then one decode step's attention (the loop and the merge) over a cache's buffers of random codes, its device
      time and GB/s against the copy bandwidth at the gate's target points (one Qwen3-8B layer, 4K and 32K, B = 1
      and 64), to set beside the gate's prediction. Its two Gluon compiles are not in the dry run's count.
  conformance (90 s): `pytest conformance --impl triton --device cuda --hypothesis-profile gpu-short` on the
      decode-attention properties (P7; P11's, per-token precision) and the quantization codes (P5), compiled: of
      each property's explicit examples the first of each dtype (float16, bfloat16) alone, no draws.
  separate (30 s, only when a conformance property failed, or when asked for without conformance):
      benchmarks/tests/test_separate.py, which separates the cause: (a) the unpack alone, (b) the dots alone over exact
      dequantized operands, (c) the fused decode, each against the spec; the record's `cause` names the part that
      fails alone.
  capture (60 s): one decode step captured in a CUDA graph and replayed across residual-page
      completions, with its device-side input checks (pnmix/tests/test_capturable.py,
      test_sync_free.py), against eager decoding; after conformance, whose compiles it reuses. Then
      the evaluation path on the Triton caches (`CAPTURE_TESTS`): chunks stepwise, rollback, and
      lm-eval's scores through impl=triton against the spec within property 7's rule.
  kernel (40 s): decode attention of one Qwen3-8B layer (B = 1, 8 KV heads, GQA 4, d = 128,
      fp16) over a preallocated 32K-token cache, default PN-Mix: GB/s of the bytes it reads
      against the same device's copy bandwidth (1 GiB buffer, read + write), device time and
      CUDA-graph replay time; FP16 SDPA at the same point beside it. Where `ncu` (Nsight Compute) is on PATH, the
      decode kernel's achieved DRAM throughput, DRAM bytes read, duration and top warp stall reasons at the same
      point (`benchmarks.commands.ncu`), in the time left of the step's budget; else "ncu not found".
  fig7 (35 s): one Fig. 7 point, PN-Mix at decode step 16K: eager step and graph replay (24 s on the H200, 2026-11-30).
  fig6c (30 s): one Fig. 6c point, PN-Mix at B = 20 (sampled protocol), tokens/s.
Optional steps, each when the steps before it left its budget of --time-budget (or alone with --steps; a skip is
no failure):
  ptx (90 s): PN-Mix's decode with the PTX unpack of its value codes asked for and not (`pnmix.kernels.ptx_unpack`,
      on by default): which path each took (the device's self-test outcome, in its words), each one's error by
      property 7's rule, whether the two outputs are the same bits, and their times
      (benchmarks/suites/test_ptx_unpack.py).
  launch (120 s): the kernel step's PN-Mix point at each launch choice of
      `benchmarks.efficiency.workloads.LAUNCH_GRID` (tile, warps, stages, splits): GB/s, and the error against the
      float64 oracle by property 7's rule.
  conformance-full (300 s): the conformance step's properties on the `ci` profile's grid (its explicit examples
      and draws), compiled.
The default mode runs `pytest conformance pnmix --impl triton --device cuda` and the suites at
full scale (the short sweep by default: every kernel point and the Fig. 6/7 points that decide
the paper's claims). --tiny runs the same steps at tiny scale on any device (the CPU under the
Triton interpreter: the harness check, timings not predictive; capture keeps its CUDA-graph tests, which skip
there, and leaves the evaluation path to the test command). Results, all in --out, at most six files: the record
`gpu-check-<device>-<time>.json` (each step's command, budget, seconds, outcome, specializations and the
figures above; rewritten as each step ends), the conformance JSON (and the full grid's), one pytest-benchmark JSON
holding every benchmark step's points (merged as each step ends) and the junit XML of capture (and of separate).
No earlier file is overwritten, and nothing is written elsewhere: the steps run in a temporary folder (pytest's
and hypothesis' own files land there) that is removed at the end. `--out` is checked before the first step (a
folder this process can write, created if missing); a record that cannot be written in `--out` at the end is
kept in a temporary folder, named in the one line that ends the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

import torch
from tabulate import tabulate

from benchmarks.commands import ncu, preflight, specializations, subprocesses
from benchmarks.commands.saving import save
from benchmarks.efficiency.memory import DEFAULT_BUDGET_GIB
from benchmarks.efficiency.workloads import (
    SCALES,
    fig6c_throughput,
    fig7_latency,
    kernel_decode,
    kernel_fragment,
    kernel_launch,
    kernel_ptx,
)
from reference import schema
from reference.cli import positive_float
from reference.methods import names
from reference.paper import FIG6C_TOKENS_PER_S
from reference.records import device_name, record, utc_stamp, write_json

#: The checkout the steps' test files are in: every path handed to pytest is absolute, so a step runs from any folder.
ROOT = Path(__file__).resolve().parents[2]
SUITES = {
    "memory": "benchmarks/suites/test_fig6_memory.py",
    "throughput": "benchmarks/suites/test_fig6c_throughput.py",
    "latency": "benchmarks/suites/test_fig7_latency.py",
    "kernels": "benchmarks/suites/test_kernels.py",
}
#: The suite of the PTX unpack's step (not one of SUITES: the full-mode sweep leaves it out).
PTX_SUITE = "benchmarks/suites/test_ptx_unpack.py"
#: The suite of the fragment-order loop's step (the design of the next decode kernel; not one of SUITES).
FRAGMENT_SUITE = "benchmarks/suites/test_fragment_design.py"
#: The tests of the separate step: the unpack alone, the dots alone, the fused decode.
SEPARATE_TESTS = "benchmarks/tests/test_separate.py"
#: Conformance properties of --short: the decode kernels and the quantization kernels, compiled;
#: under the interpreter (--tiny) the packing property alone keeps the check within seconds.
SHORT_PROPERTIES = (
    "test_decode_attention_within_the_low_precision_error",
    "test_codes_and_scales_are_the_reference_numerics",
    "test_attention_over_its_own_cache_within_the_low_precision_error",  # per-token precision's decode
)
TINY_PROPERTIES = ("test_key_codes_roundtrip",)
#: What the steps that are not conformance's pass pytest: no conformance plug-in, which would load every built-in
#: implementation (seconds of imports each step: transformers' quantized caches among them) for no test of theirs.
NO_CONFORMANCE = ("-p", "no:conformance.plugin", f"--rootdir={ROOT}")
#: The Triton implementations the conformance steps check.
TRITON_IMPLS = ("--impl", "triton", "--impl", "triaxialkv-triton", "--impl", "role-aware-pnmix-triton")
#: The hypothesis profiles (conftest.py) of the conformance step and of the optional full grid.
SHORT_PROFILE, FULL_PROFILE = "gpu-short", "ci"
#: Seconds each --short step may take (see the module docstring).
BUDGET_S = {
    "fragment": 30,
    "conformance": 90,
    "separate": 30,
    "capture": 60,
    "kernel": 40,
    "fig7": 35,
    "fig6c": 30,
    "ptx": 90,
    "launch": 120,
    "conformance-full": 300,
}
#: Steps left out of the default total: each runs when the steps before it left its budget
#: unspent (or with a larger --time-budget, or alone with --steps), and its skip is no failure.
OPTIONAL = frozenset({"ptx", "launch", "conformance-full"})
#: Seconds of the session that are gpu_check's own: the dry run that counts the specializations (23 s for the
#: default steps at full scale on 2 busy CPU cores, 2026-12-06, most of it capture's tests), the records.
OVERHEAD_S = 45
#: All of --short: the default steps (separate's budget held back for a failing conformance step) and OVERHEAD_S.
TIME_BUDGET_S = sum(b for name, b in BUDGET_S.items() if name not in OPTIONAL) + OVERHEAD_S
#: What a 15-minute lease leaves --short, with a cold start and a rerun.
LEASE_SHARE_S = 360
#: Seconds pytest gets, once interrupted at a step's budget, to write its results before it is killed.
GRACE_S = 15
#: Figures of each suite that the gpu_check record and printout carry.
SUMMARY_KEYS = {
    "kernel": (
        "method",
        "context",
        "code_order",
        "ms",
        "graph_ms",
        "gbps",
        "copy_gbps",
        "fraction_of_copy",
        "host_gaps_excluded",
    ),
    "fig7-latency": ("method", "step", "code_order", "step_ms", "graph_ms", "graph_capturable", "roofline_step_ms"),
    "fig6c-throughput": ("method", "batch", "tokens_per_s", "total_s"),
    "kernel-fragment": ("batch", "context", "path", "self_test", "splits", "ms", "gbps", "fraction_of_copy"),
    "kernel-ptx": (
        "batch",
        "context",
        "plain_path",
        "ptx_path",
        "self_test",
        "identical",
        "plain_max_error",
        "ptx_max_error",
        "error_bound",
        "plain_ms",
        "ptx_ms",
    ),
    "kernel-launch": (
        "block_n",
        "warps",
        "stages",
        "splits",
        "fits",
        "ms",
        "gbps",
        "fraction_of_copy",
        "max_error",
        "error_bound",
    ),
}
COMMON_SUMMARY = ("oom", "check_finite", "budget_gib", "graph_note")


@dataclass(frozen=True)
class Step:
    name: str
    budget_s: int
    what: str
    args: tuple[str, ...]  # pytest's
    json: str  # the result file it leaves in --out
    dry: dict = field(default_factory=dict)  # what the dry run runs: {"pytest": args} or {"points": [...]}
    staged: str | None = None  # a pytest-benchmark file written in the temporary folder, merged into `json`


def point_id(path: str, test: str, workloads, scale: str, **coordinates) -> str:
    """The pytest node id of the one workload of `workloads` at `scale` with these coordinates."""
    found = [w for w in workloads(SCALES[scale]) if all(getattr(w, k) == v for k, v in coordinates.items())]
    if len(found) != 1:
        raise LookupError(f"{workloads.__name__}({scale}) has {len(found)} points with {coordinates}, expected 1")
    return f"{ROOT / path}::{test}[{found[0].id}]"


def _point(work, **extra) -> dict:
    """A kernel point as the dry run builds it (`specializations`)."""
    scale = SCALES[work.scale]
    return {"method": work.method, "batch": work.batch, "context": work.context, "layer": list(work.layer)} | {
        "prompt": scale.prompt,
        **extra,
    }


def _walks(fig7: list, fig6c: list) -> tuple[list[dict], list[dict]]:
    """The dry run's walks of the Fig. 7 and Fig. 6c points: the cache of one layer of the model, its prompt, then
    what the suite does: Fig. 7 fills to the step and times warm-up + reps steps on the eager cache, then fills its
    capturable twin as far and captures a step after a warm-up one; Fig. 6c fills to each sample and times its
    steps."""
    walks7, walks6c = [], []
    for w in fig7:
        scale = SCALES[w.scale]
        kv, q_heads, d = scale.arch.shape.kv_heads, scale.arch.shape.query_heads, scale.arch.shape.head_dim
        target, steps = scale.prompt + w.step, scale.warmup + scale.reps
        common = {"kind": "walk", "method": w.method, "batch": 1, "layer": [kv, q_heads // kv, d]}
        walks7.append(
            common
            | {"prompt": scale.prompt, "capacity": scale.prompt + w.generation}
            | {"plan": [["fill", target], ["steps", steps]]}
            | {"twin": [["fill", target], ["fill", target + steps], ["steps", 2]]}
        )
    for w in fig6c:
        scale = SCALES[w.scale]
        kv, q_heads, d = scale.arch.shape.kv_heads, scale.arch.shape.query_heads, scale.arch.shape.head_dim
        plan = [p for s in w.samples for p in (["fill", scale.prompt + s], ["steps", scale.warmup + scale.reps])]
        walks6c.append(
            {"kind": "walk", "method": w.method, "batch": w.batch, "layer": [kv, q_heads // kv, d]}
            | {"prompt": scale.prompt, "capacity": scale.prompt + w.generation, "plan": plan}
        )
    return walks7, walks6c


def short_steps(tiny: bool, out: Path, stamp: str, safe: str, budget_gib: float, staging: Path | None = None):
    """The --short steps in their order (the optional ones last): `Step`s whose results go to `out` (benchmark
    files first to `staging`, the run's temporary folder)."""
    staging = out if staging is None else staging
    scale, dev = "tiny" if tiny else "full", "cuda" if torch.cuda.is_available() else "cpu"
    kernel = {"batch": 1, "context": 300} if tiny else {"batch": 1, "context": 32 * 1024}
    fig7 = {"method": "PN-Mix", "step": 10 if tiny else 16 * 1024}
    fig6c = {"method": "PN-Mix", "batch": 1 if tiny else 20}
    properties = TINY_PROPERTIES if tiny else SHORT_PROPERTIES
    bench_json = str(out / f"bench-{safe}-{stamp}.json")

    def bench(name: str, ids: list[str]) -> dict:
        staged = staging / f"bench-{name}.json"
        args = (
            *ids,
            *NO_CONFORMANCE,
            "--benchmark-only",
            "--budget-gib",
            str(budget_gib),
            "--benchmark-json",
            str(staged),
        )
        return {"args": args, "json": bench_json, "staged": str(staged)}

    def conformance(profile: str, path: Path) -> tuple[tuple[str, ...], dict]:
        selection = (
            str(ROOT / "conformance"),
            f"--ignore={ROOT / 'conformance' / 'meta'}",
            f"--rootdir={ROOT}",
            *TRITON_IMPLS,
            "--hypothesis-profile",
            profile,
            "-k",
            " or ".join(properties),
        )
        return (*selection, "--device", dev, "--conformance-json", str(path)), {"pytest": list(selection)}

    kernel_works = [
        w
        for w in kernel_decode(SCALES[scale])
        if w.method in names(tag="fig6") and all(getattr(w, k) == v for k, v in kernel.items())
    ]
    kernel_ids = [
        point_id(SUITES["kernels"], "test_decode_attention_bandwidth", kernel_decode, scale, method=w.method, **kernel)
        for w in kernel_works
    ]
    fig7_id = point_id(SUITES["latency"], "test_fig7_step_latency", fig7_latency, scale, **fig7)
    fig6c_id = point_id(SUITES["throughput"], "test_fig6c_throughput", fig6c_throughput, scale, **fig6c)
    launch_works, ptx_works = kernel_launch(SCALES[scale]), kernel_ptx(SCALES[scale])
    fragment_ids = [
        f"{ROOT / FRAGMENT_SUITE}::test_fragment_order_loop[{w.id}]" for w in kernel_fragment(SCALES[scale])
    ]
    launch_ids = [f"{ROOT / SUITES['kernels']}::test_decode_launch_choice[{w.id}]" for w in launch_works]
    ptx_ids = [f"{ROOT / PTX_SUITE}::test_decode_with_and_without_the_ptx_unpack[{w.id}]" for w in ptx_works]
    (fig7_work,) = [w for w in fig7_latency(SCALES[scale]) if all(getattr(w, k) == v for k, v in fig7.items())]
    (fig6c_work,) = [w for w in fig6c_throughput(SCALES[scale]) if all(getattr(w, k) == v for k, v in fig6c.items())]
    walks7, walks6c = _walks([fig7_work], [fig6c_work])
    short_args, short_dry = conformance(SHORT_PROFILE, out / f"conformance-triton-{stamp}.json")
    full_args, full_dry = conformance(FULL_PROFILE, out / f"conformance-triton-full-{stamp}.json")
    capture_nodes = [str(ROOT / node) for node in (CAPTURE_GRAPH_TESTS if tiny else CAPTURE_TESTS)]
    counted_capture = [n for n in capture_nodes if not n.endswith(CAPTURE_GRAPH_TESTS)]
    capture_xml = out / f"capture-{safe}-{stamp}.xml"
    separate_xml = out / f"separate-{safe}-{stamp}.xml"
    separate = (str(ROOT / SEPARATE_TESTS), *NO_CONFORMANCE)
    what = {
        "fragment": "the fragment-order loop (the next decode kernel's design): its self-test here (the path it "
        "takes, in its words), then its split kernel's time and bandwidth at the gate's target points",
        "conformance": f"compiled conformance of the Triton implementation, one example per dtype "
        f"(--hypothesis-profile {SHORT_PROFILE}): {', '.join(properties)}",
        "separate": "after a conformance failure: the unpack alone, the dots alone over exact operands, the fused "
        "decode, each against the spec",
        "capture": "a captured decode step replayed across page completions, checks included, against eager",
        "kernel": "decode-attention bandwidth against this device's copy bandwidth; ncu's DRAM throughput and stalls",
        "fig7": "one Fig. 7 point: eager step and CUDA-graph replay",
        "fig6c": "one Fig. 6c point: tokens/s",
        "ptx": "the decode kernel with the PTX unpack asked for and not: the path each took (the self-test's "
        "outcome), errors by property 7's rule, same bits or not, times",
        "launch": "the decode kernel at each launch choice of benchmarks.efficiency.workloads.LAUNCH_GRID: "
        "bandwidth and error",
        "conformance-full": f"compiled conformance on the {FULL_PROFILE} profile's grid: {', '.join(properties)}",
    }
    triton_kernels = [w for w in kernel_works if w.method != "FP16"]  # SDPA launches no Triton kernel
    points = {
        "kernel": [_point(w, kind="kernel") for w in triton_kernels],
        "ptx": [_point(w, kind="ptx") for w in ptx_works],
        "launch": [
            _point(w, kind="launch", block_n=w.block_n, warps=w.warps, stages=w.stages, split_factor=w.split_factor)
            for w in launch_works
        ],
        "fig7": walks7,
        "fig6c": walks6c,
    }

    def step(name: str, **parts) -> Step:
        return Step(name, BUDGET_S[name], what[name], **parts)

    return [
        # Gluon kernels: none of the Triton specializations the dry run counts (two compiles, with and without PTX)
        step("fragment", **bench("fragment", fragment_ids), dry={"points": []}),
        step("conformance", args=short_args, json=str(out / f"conformance-triton-{stamp}.json"), dry=short_dry),
        step(
            "separate",
            args=(*separate, "--junitxml", str(separate_xml)),
            json=str(separate_xml),
            dry={"pytest": [*separate]},
        ),
        step(
            "capture",
            args=(*capture_nodes, *NO_CONFORMANCE, "--junitxml", str(capture_xml)),
            json=str(capture_xml),
            # the CUDA-graph tests skip without CUDA, in the dry run too: not counted (`UNCOUNTED`)
            dry={"pytest": [*counted_capture, *NO_CONFORMANCE]} if counted_capture else {"points": []},
        ),
        step("kernel", **bench("kernel", kernel_ids), dry={"points": points["kernel"]}),
        step("fig7", **bench("fig7", [fig7_id]), dry={"points": points["fig7"]}),
        step("fig6c", **bench("fig6c", [fig6c_id]), dry={"points": points["fig6c"]}),
        step("ptx", **bench("ptx", ptx_ids), dry={"points": points["ptx"]}),
        step("launch", **bench("launch", launch_ids), dry={"points": points["launch"]}),
        step("conformance-full", args=full_args, json=str(out / f"conformance-triton-full-{stamp}.json"), dry=full_dry),
    ]


#: The CUDA-graph tests of the decode step (skipped, saying why, without CUDA).
CAPTURE_GRAPH_TESTS = (
    "pnmix/tests/test_capturable.py::test_one_captured_step_replays_across_page_completions",
    "pnmix/tests/test_sync_free.py::test_a_checked_decode_step_is_captured_and_replays_its_checks",
)
#: What the dry run cannot count, by step: tests that need CUDA to run at all.
UNCOUNTED = {"capture": f"its {len(CAPTURE_GRAPH_TESTS)} CUDA-graph tests need CUDA, which the dry run hides"}
#: CAPTURE_GRAPH_TESTS, then the evaluation path on the Triton caches: chunks stepwise, a context's checkpoint
#: returned to, and lm-eval's scores through impl=triton against the spec within property 7's rule.
CAPTURE_TESTS = (
    *CAPTURE_GRAPH_TESTS,
    "pnmix/tests/test_hf_models.py::test_the_triton_backend_decodes_chunks_stepwise_as_token_by_token",
    "pnmix/tests/test_hf_models.py::test_a_triton_cache_rolls_back_to_one_checkpoint_any_number_of_times",
    "benchmarks/tests/test_lm_eval_model.py::"
    "test_the_triton_implementation_scores_as_the_spec_within_its_own_low_precision_error",
)

#: Lines of a step's output kept to say why it failed (the output itself is streamed as it comes).
TAIL_LINES = 60


def failure_reason(lines: list[str]) -> str | None:
    """Why a pytest run failed, from the end of its output: the exception of each traceback ('E   '
    lines naming an error class, else the last 'E' line; also pytest's 'INTERNALERROR>' lines and the
    last line of a traceback pytest did not catch, as when a plug-in cannot write its result file at
    the session's end) and its 'FAILED'/'ERROR' summary lines (None when there is none)."""
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    errors += [line.removeprefix("INTERNALERROR>").strip() for line in lines if line.startswith("INTERNALERROR>")]
    errors += [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    named = [e for e in errors if re.match(r"^[\w.]+(Error|Exception|Exit)\b", e)]
    summary = [line.strip() for line in lines if line.startswith(("FAILED ", "ERROR "))]
    parts = list(dict.fromkeys(named or errors[-1:])) + summary
    return " | ".join(parts)[:1000] if parts else None


def run_pytest(args: list[str] | tuple[str, ...], timeout_s: float | None = None, cwd: Path | None = None) -> dict:
    """Run pytest as a step (`benchmarks.commands.subprocesses.run`: output streamed, its end kept for
    `reason`; past timeout_s interrupted, pytest then writes its results) in `cwd`, and say how it ended."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", *args]
    ended = subprocesses.run(cmd, echo=True, timeout_s=timeout_s, grace_s=GRACE_S, cwd=cwd)
    return {
        "command": " ".join(["pytest", *cmd[5:]]),
        "exit_code": ended.exit_code,
        "seconds": ended.seconds,
        "timed_out": ended.timed_out,
        "reason": None if ended.exit_code == 0 else failure_reason(list(ended.tail)[-TAIL_LINES:]),
    }


def summarize(path: Path) -> list[dict]:
    """The figures of a step's result file: conformance outcomes, each test's outcome of a junit XML,
    or each benchmark's SUMMARY_KEYS."""
    if path.suffix == ".xml":
        return junit_outcomes(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # not written, or left empty by a run that stopped before its end
        return []
    if "results" in data:  # conformance
        return [
            {"property": r["property"], "outcome": r["outcome"], "seconds": r["duration_s"]} for r in data["results"]
        ]
    rows = []
    for bench in data.get("benchmarks", []):
        info = bench.get("extra_info", {})
        keys = SUMMARY_KEYS.get(info.get("suite"), ())
        row = {k: info.get(k) for k in (*keys, *COMMON_SUMMARY) if k in info}
        if info.get("suite") == "fig6c-throughput":
            row["paper_tokens_per_s"] = FIG6C_TOKENS_PER_S.get((info.get("method"), info.get("batch")))
        rows.append(row)
    return rows


def junit_outcomes(path: Path) -> list[dict]:
    """Each test of a junit XML: its name, outcome and seconds ([] when it was not written)."""
    try:
        cases = list(ElementTree.parse(path).iter("testcase"))
    except (OSError, ElementTree.ParseError):
        return []
    rows = []
    for case in cases:
        ended = [tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[ended[0]] if ended else "passed"
        rows.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time") or 0)})
    return rows


def merge_benchmarks(staged: Path, merged: Path) -> int:
    """Append the benchmarks of a step's pytest-benchmark file to the session's one (created from the first, its
    machine and commit information kept), atomically, then remove the staged file. Returns how many were added
    (0 when the step wrote none, or left the file empty). OSError: the session's file could not be written."""
    try:
        data = json.loads(staged.read_text())
    except (OSError, ValueError):
        staged.unlink(missing_ok=True)
        return 0
    added = data.get("benchmarks", [])
    if merged.exists():
        whole = json.loads(merged.read_text())
        whole["benchmarks"] = [*whole.get("benchmarks", []), *added]
    else:
        whole = data
    write_json(merged, whole, overwrite=True)
    staged.unlink()
    return len(added)


def separate_cause(rows: list[dict]) -> str:
    """What the separate step's outcomes (`junit_outcomes` of benchmarks/tests/test_separate.py) say of the cause."""
    failed = {
        part
        for part in ("unpack_alone", "dot_alone", "fused")
        for r in rows
        if part in r["test"] and r["outcome"] in ("failed", "error")
    }
    if not rows:
        return "unknown: no test outcome was recorded"
    if "unpack_alone" in failed:
        return "the unpack: it fails alone"
    if "dot_alone" in failed:
        return "the dots: they fail alone, over exact dequantized operands"
    if "fused" in failed:
        return "the fused decode: the unpack and the dots pass alone, their combination fails"
    return "not reproduced: the unpack, the dots and the fused decode pass on these cases"


def conformance_failed(step: dict | None) -> bool:
    """Whether a conformance step ran and a property failed (exit status 1, or a failed result): what the separate
    step is for (a step cut at its budget with no failure is not)."""
    if not step or step.get("exit_code") is None:
        return False
    return step["exit_code"] == 1 or any(r.get("outcome") == "failed" for r in step.get("results", []))


def gpu_target() -> tuple[int, int]:
    """(compute capability, SMs) the dry run compiles for: this CUDA device's, else `specializations.DEFAULT_GPU`."""
    return specializations.default_target()


class Counter:
    """The specializations of each step: counted by one dry run before the first step (`specializations.count`),
    less what the steps that ran before it compiled."""

    def __init__(self, target: tuple[int, int], cwd: Path) -> None:
        self.target, self.cwd, self.counted, self.compiled = target, cwd, {}, set()

    def count(self, steps: list[Step]) -> None:
        wanted = {s.name: s.dry for s in steps if s.name not in self.counted}
        if not wanted:
            return
        found = specializations.count(wanted, self.target, self.cwd)
        for name in wanted:
            self.counted[name] = found.get(name) or {"error": found.get("error", "not counted")}

    def of(self, step: Step) -> dict:
        """The step's entry of the record: its count (what no earlier step compiled), all it launches, the
        estimated compile seconds (an estimate: `specializations.SECONDS_PER_SPECIALIZATION`)."""
        found = self.counted.get(step.name, {"error": "not counted: it does not run"})
        gpu = f"sm_{self.target[0]}, {self.target[1]} SMs"
        if "error" in found:
            return {"count": None, "error": found["error"], "target": gpu}
        keys = set(found["keys"])
        new = len(keys - self.compiled)
        return {
            "count": new,
            "launched": len(keys),
            "estimated_compile_s": specializations.seconds(new),
            "seconds_per_specialization": round(specializations.SECONDS_PER_SPECIALIZATION, 3),
            "estimate_source": specializations.ESTIMATE_SOURCE,
            "tests": found["tests"],
            "skipped_tests": found["skipped"],
            "skip_reasons": found.get("skip_reasons", []),
            "target": gpu,
            **({"not_counted": UNCOUNTED[step.name]} if step.name in UNCOUNTED else {}),
        }

    def ran(self, step: Step) -> None:
        self.compiled |= set(self.counted.get(step.name, {}).get("keys", []))


def count_line(name: str, entry: dict, budget_s: int) -> str:
    """The line a step prints of its specializations, before it runs."""
    if entry["count"] is None:
        return f"gpu_check: {name}: specializations not counted ({entry['error']})"
    reasons = "; ".join(entry.get("skip_reasons", []))
    reasons = reasons if len(reasons) <= 120 else reasons[:117] + "..."
    skipped = f"; {entry['skipped_tests']} test(s) skipped ({reasons})" if entry["skipped_tests"] else ""
    skipped += f"; not counted: {entry['not_counted']}" if "not_counted" in entry else ""
    over = " (above its budget: it may be cut while compiling)" if entry["estimated_compile_s"] > budget_s else ""
    estimate = f"estimated {entry['estimated_compile_s']:g} s at {entry['seconds_per_specialization']:g} s each"
    earlier = entry["launched"] - entry["count"]
    launched = f"{entry['launched']} launched, {earlier} compiled by earlier steps; " if earlier else ""
    return (
        f"gpu_check: {name}: {entry['count']} kernel specializations to compile ({launched}{entry['target']}"
        f"{skipped}), {estimate}{over}"
    )


def profile_kernel(step: Step, left_s: float, cwd: Path, tiny: bool) -> dict:
    """ncu on the kernel step's PN-Mix point (`benchmarks.commands.ncu`), within left_s: its figures, or why not."""
    found = ncu.find()
    if found is None:
        return {"status": "ncu not found"}
    if tiny or not torch.cuda.is_available():
        return {"status": "not profiled: ncu profiles a CUDA device's kernel"}
    point = step.dry["points"][0]
    cmd = ncu.command(found, point["batch"], point["context"])
    if left_s < 5:
        return {"status": f"not profiled: {left_s:.0f} s left of the step's budget", "command": " ".join(cmd)}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=left_s)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {left_s:.0f} s", "command": " ".join(cmd)}
    try:
        figures = ncu.summary(ncu.parse_csv(done.stdout))
    except ValueError as err:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        return {"status": f"failed (exit {done.returncode}): {err}; {last[0][:300]}", "command": " ".join(cmd)}
    return {"status": "profiled", "command": " ".join(cmd), **figures}


def run_short(args, out: Path, stamp: str, safe: str, staging: Path, checkpoint) -> dict[str, dict]:
    """The --short steps wanted, each within its budget and what is left of --time-budget; checkpoint(steps) is
    called as each ends (the record rewritten)."""
    wanted = [s for s in args.steps if not (args.skip_conformance and s.startswith("conformance"))]
    steps = [s for s in short_steps(args.tiny, out, stamp, safe, args.budget_gib, staging) if s.name in wanted]
    start, done = time.monotonic(), {}
    counter = Counter(gpu_target(), staging)
    counter.count([s for s in steps if s.name not in OPTIONAL])
    for step in steps:
        left = args.time_budget - (time.monotonic() - start)
        command = " ".join(["pytest", "-q", *step.args])
        conformance = done.get("conformance")
        asked_alone = step.name == "separate" and "conformance" not in args.steps  # `--steps separate ...`
        if step.name == "separate" and not asked_alone and not conformance_failed(conformance):
            why = "conformance did not run" if conformance is None else f"conformance {conformance['status']}"
            skip = f"not needed: {why} (it runs when a conformance property fails)"
        elif step.budget_s > left:
            optional = " (optional: no failure)" if step.name in OPTIONAL else ""
            skip = f"skipped: would overrun ({step.budget_s} s budget, {left:.0f} s left of {args.time_budget:g} s)"
            skip += optional
        else:
            skip = None
            counter.count([step])  # an optional step is counted once it will run (a default one was already)
        entry = counter.of(step)
        print(count_line(step.name, entry, step.budget_s), flush=True)
        print(f"gpu_check: {step.name}: budget {step.budget_s} s, {left:.0f} s left: {step.what}", flush=True)
        if skip is not None:
            done[step.name] = {
                "command": command,
                "exit_code": None,
                "seconds": 0.0,
                "timed_out": False,
                "status": skip,
            }
        else:
            began = time.monotonic()
            ran = run_pytest(step.args, timeout_s=step.budget_s, cwd=staging)
            counter.ran(step)
            status = "timed out" if ran["timed_out"] else "passed" if ran["exit_code"] == 0 else "failed"
            done[step.name] = {**ran, "status": status}
            if step.name == "kernel":
                left_in_step = step.budget_s - (time.monotonic() - began)
                done[step.name]["ncu"] = profile_kernel(step, left_in_step, staging, args.tiny)
        results = summarize(Path(step.staged or step.json))
        if step.staged is not None:
            try:
                merge_benchmarks(Path(step.staged), Path(step.json))
            except OSError as err:  # its figures are in the record; the end of the run says where that went
                print(f"gpu_check: {step.name}: cannot add its benchmarks to {step.json} ({err.strerror or err})")
        done[step.name] |= {
            "budget_s": step.budget_s,
            "what": step.what,
            "json": step.json,
            "results": results,
            "specializations": entry,
        }
        if step.name == "separate" and done[step.name]["exit_code"] is not None:
            done[step.name]["cause"] = separate_cause(results)
            print(f"gpu_check: separate: cause: {done[step.name]['cause']}", flush=True)
        if "ncu" in done[step.name]:
            print(f"gpu_check: {step.name}: ncu: {ncu_line(done[step.name]['ncu'])}", flush=True)
        print(
            f"gpu_check: {step.name}: {done[step.name]['status']} after {done[step.name]['seconds']} s "
            f"(budget {step.budget_s} s)",
            flush=True,
        )
        checkpoint(done)
    return done


def ncu_line(found: dict) -> str:
    if found.get("status") != "profiled":
        return found["status"]
    stalls = ", ".join(f"{s['reason']} {s['cycles_per_issue']:.3g}" for s in found["top_stalls"])
    pct = found["dram_throughput_pct_of_peak"]
    return (
        f"DRAM {pct if pct is None else f'{pct:.1f}'} % of peak, {found['dram_bytes_read']} bytes read in "
        f"{found['duration_ns']} ns; top stalls (cycles per issued instruction): {stalls or 'none reported'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pnmix-gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder for the results")
    parser.add_argument("--tiny", action="store_true", help="tiny scale, no CUDA needed (harness check)")
    parser.add_argument("--short", action="store_true", help="the steps that fit a 15-minute GPU lease, each budgeted")
    names = [s.name for s in short_steps(True, Path(), "", "", DEFAULT_BUDGET_GIB)]
    parser.add_argument("--steps", nargs="+", choices=names, default=names, help="with --short: these steps only")
    parser.add_argument(
        "--time-budget", type=positive_float, default=TIME_BUDGET_S, help="with --short: seconds for all steps"
    )
    parser.add_argument("--sweep", choices=("short", "all"), default="short")
    parser.add_argument("--suites", nargs="+", choices=sorted(SUITES), default=sorted(SUITES))
    parser.add_argument("--budget-gib", type=positive_float, default=DEFAULT_BUDGET_GIB, help="GPU memory (> 0)")
    parser.add_argument("--skip-conformance", action="store_true")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_check: CUDA is not available; nothing to measure (use --tiny to exercise the harness)")
        return 0
    out = preflight.output_folder(parser, args.out).resolve()
    device = torch.device("cuda" if cuda else "cpu")
    safe = "".join(ch if ch.isalnum() else "-" for ch in device_name(device)).strip("-")[:40]
    stamp = utc_stamp()
    record_name = f"gpu-check-{safe}-{stamp}.json"
    staging = Path(tempfile.mkdtemp(prefix="gpu-check-"))  # the steps' working folder, removed at the end
    try:
        result = run(args, out, stamp, safe, staging, device, record_name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for name, step in result["steps"].items():  # first: on screen whatever happens to the record
        print(f"gpu_check: {name}: exit {step['exit_code']} in {step['seconds']} s: {step['command']}")
        if step.get("results"):
            print(tabulate(step["results"], headers="keys", tablefmt="github", floatfmt=".4g"))
    (path,) = save(parser.prog, out, {record_name: lambda p: write_json(p, result, overwrite=True)})
    print(f"gpu_check: written to {path}")
    failed = [
        name
        for name, step in result["steps"].items()
        if step["exit_code"] != 0 and not ((name in OPTIONAL or name == "separate") and step["exit_code"] is None)
    ]
    return 1 if failed else 0


def run(args, out: Path, stamp: str, safe: str, staging: Path, device: torch.device, record_name: str) -> dict:
    """The session's steps, run in `staging`: the record (rewritten in `out` as each --short step ends)."""
    if args.short:
        result = record(
            "gpu-check",
            device,
            mode="short",
            scale="tiny" if args.tiny else "full",
            time_budget_s=args.time_budget,
            budget_gib=args.budget_gib,
            steps={},
        )
        warned = []

        def checkpoint(steps: dict) -> None:
            result["steps"] = steps
            try:
                write_json(out / record_name, result, overwrite=True)
            except OSError as err:  # the end of the run tries again, and says where it went
                if not warned:
                    warned.append(err)
                    print(f"gpu_check: cannot write {record_name} in {out} yet ({err.strerror or err})", flush=True)

        result["steps"] = run_short(args, out, stamp, safe, staging, checkpoint)
        return result
    result = record("gpu-check", device, mode="suites", steps={})
    steps = result["steps"]
    if device.type == "cuda" and not args.skip_conformance:
        steps["conformance"] = run_pytest(
            [
                str(ROOT / "conformance"),
                str(ROOT / "pnmix"),
                f"--rootdir={ROOT}",
                *TRITON_IMPLS,
                "--device",
                "cuda",
                f"--ignore={ROOT / 'conformance' / 'meta'}",
                "--conformance-json",
                str(out / f"conformance-triton-{stamp}.json"),
            ],
            cwd=staging,
        )
    bench_json = out / f"bench-{safe}-{stamp}.json"
    steps["benchmarks"] = run_pytest(
        [
            *(str(ROOT / SUITES[s]) for s in args.suites),
            *NO_CONFORMANCE,
            "--benchmark-only",
            "--bench-scale",
            "tiny" if args.tiny else "full",
            "--bench-sweep",
            args.sweep,
            "--budget-gib",
            str(args.budget_gib),
            "--benchmark-json",
            str(bench_json),
        ],
        cwd=staging,
    )
    steps["benchmarks"]["json"] = str(bench_json)
    return result


#: What a GPU check's record holds, as the report reads it (each step's command, outcome and seconds).
SCHEMA = {
    "device?": schema.TEXT,
    "date_utc?": schema.TEXT,
    "command?": schema.TEXT,
    "steps?": {
        "*": {
            "command": str,
            "exit_code": schema.Maybe(schema.EXIT_CODE),
            "seconds": schema.Maybe(schema.SECONDS),
            "json?": schema.TEXT,
        }
    },
}
#: A GPU check's record (a timing: current by its code fingerprint, no canary).
KIND = schema.Kind("gpu-check", SCHEMA)


if __name__ == "__main__":
    sys.exit(main())
