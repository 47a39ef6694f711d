"""One command for a GPU session: compiled conformance of the Triton implementation, then the
benchmark suites, with every result kept under benchmarks/results/.

    python -m benchmarks.gpu_check --short [--steps NAME ...] [--time-budget S] [--out DIR]
                                   [--tiny] [--budget-gib 40]
    python -m benchmarks.gpu_check [--out DIR] [--sweep short|all] [--suites NAME ...]
                                   [--skip-conformance] [--tiny] [--budget-gib 40]

--short fits a 15-minute lease on a cold machine (start-up and JIT compilation included, 495 s
of steps): each step is its own pytest process with a time budget, interrupted at its budget
(pytest still writes what it finished) and skipped when less than its budget is left of
--time-budget (default 525 s). Each runs only its points, so Triton compiles only the kernels
they launch (nothing is compiled ahead or warmed up for later).
  conformance (120 s): `pytest conformance --impl triton --device cuda --hypothesis-profile ci`
      on the decode-attention and quantization-codes properties (P7, P5), compiled.
  capture (45 s): one decode step captured in a CUDA graph and replayed across residual-page
      completions, with its device-side input checks (pnmix/tests/test_capturable.py,
      test_sync_free.py), against eager decoding; after conformance, whose compiles it reuses. Then
      the evaluation path on the Triton caches (`CAPTURE_TESTS`): chunks stepwise, rollback, and
      lm-eval's scores through impl=triton against the spec within property 7's rule.
  kernel (90 s): decode attention of one Qwen3-8B layer (B = 1, 8 KV heads, GQA 4, d = 128,
      fp16) over a preallocated 32K-token cache, default PN-Mix: GB/s of the bytes it reads
      against the same device's copy bandwidth (1 GiB buffer, read + write), device time and
      CUDA-graph replay time; FP16 SDPA at the same point beside it.
  fig7 (120 s): one Fig. 7 point, PN-Mix at decode step 16K: eager step and graph replay.
  fig6c (120 s): one Fig. 6c point, PN-Mix at B = 20 (sampled protocol), tokens/s.
  ptx (90 s, when the steps before it left that much of --time-budget): PN-Mix's decode with the PTX unpack of
      its value codes asked for and not (`pnmix.kernels.ptx_unpack`, on by default): which path each took (the
      device's self-test outcome, in its words), each one's error by property 7's rule, whether the two outputs
      are the same bits, and their times (benchmarks/suites/test_ptx_unpack.py).
  launch (120 s, when the steps before it left that much of --time-budget): the kernel step's
      PN-Mix point at each launch choice of `benchmarks.efficiency.workloads.LAUNCH_GRID` (tile, warps,
      stages, splits): GB/s, and the error against the float64 oracle by property 7's rule.
The default mode runs `pytest conformance pnmix --impl triton --device cuda` and the suites at
full scale (the short sweep by default: every kernel point and the Fig. 6/7 points that decide
the paper's claims). --tiny runs the same steps at tiny scale on any device (the CPU under the
Triton interpreter: the harness check, timings not predictive). Results: the conformance
JSON, one pytest-benchmark JSON per benchmark step and `gpu-check-<device>-<time>.json` (each
step's command, budget, seconds and outcome, and the figures above); nothing is overwritten.
`--out` is checked before the first step (a folder this process can write, created if missing);
each step's files are written as it ends, so a fault later in the run (a full disk) keeps what
the earlier steps measured, and a record that cannot be written in `--out` is kept in a temporary
folder, named in the one line that ends the run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import torch
from tabulate import tabulate

from benchmarks.commands import preflight, subprocesses
from benchmarks.commands.saving import save
from benchmarks.efficiency.memory import DEFAULT_BUDGET_GIB
from benchmarks.efficiency.workloads import (
    SCALES,
    fig6c_throughput,
    fig7_latency,
    kernel_decode,
    kernel_launch,
    kernel_ptx,
)
from reference.cli import positive_float
from reference.methods import names
from reference.paper import FIG6C_TOKENS_PER_S
from reference.records import device_name, record, utc_stamp, write_json

SUITES = {
    "memory": "benchmarks/suites/test_fig6_memory.py",
    "throughput": "benchmarks/suites/test_fig6c_throughput.py",
    "latency": "benchmarks/suites/test_fig7_latency.py",
    "kernels": "benchmarks/suites/test_kernels.py",
}
#: The suite of the PTX unpack's step (not one of SUITES: the full-mode sweep leaves it out).
PTX_SUITE = "benchmarks/suites/test_ptx_unpack.py"
#: Conformance properties of --short: the decode kernel and the quantization kernels, compiled;
#: under the interpreter (--tiny) the packing property alone keeps the check within seconds.
SHORT_PROPERTIES = (
    "test_decode_attention_within_the_low_precision_error",
    "test_codes_and_scales_are_the_reference_numerics",
    "test_attention_over_its_own_cache_within_the_low_precision_error",  # per-token precision's decode
)
TINY_PROPERTIES = ("test_key_codes_roundtrip",)
#: Seconds each --short step may take (see the module docstring), and all of them with room for
#: gpu_check itself: 8.5 minutes, so that a cold machine's start-up fits a 15-minute lease.
BUDGET_S = {"conformance": 120, "capture": 45, "kernel": 90, "fig7": 120, "fig6c": 120, "ptx": 90, "launch": 120}
#: Steps left out of the default total: each runs when the steps before it left its budget
#: unspent (or with a larger --time-budget, or alone with --steps), and its skip is no failure.
OPTIONAL = frozenset({"ptx", "launch"})
TIME_BUDGET_S = sum(b for name, b in BUDGET_S.items() if name not in OPTIONAL) + 30
#: Seconds pytest gets, once interrupted at a step's budget, to write its results before it is killed.
GRACE_S = 15
#: Figures of each suite that the gpu_check record and printout carry.
SUMMARY_KEYS = {
    "kernel": ("method", "context", "ms", "graph_ms", "gbps", "copy_gbps", "fraction_of_copy", "host_gaps_excluded"),
    "fig7-latency": ("method", "step", "step_ms", "graph_ms", "graph_capturable", "roofline_step_ms"),
    "fig6c-throughput": ("method", "batch", "tokens_per_s", "total_s"),
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
    json: str  # the result file it writes


def point_id(path: str, test: str, workloads, scale: str, **coordinates) -> str:
    """The pytest node id of the one workload of `workloads` at `scale` with these coordinates."""
    found = [w for w in workloads(SCALES[scale]) if all(getattr(w, k) == v for k, v in coordinates.items())]
    if len(found) != 1:
        raise LookupError(f"{workloads.__name__}({scale}) has {len(found)} points with {coordinates}, expected 1")
    return f"{path}::{test}[{found[0].id}]"


def short_steps(tiny: bool, out: Path, stamp: str, safe: str, budget_gib: float) -> list[Step]:
    scale, dev = "tiny" if tiny else "full", "cuda" if torch.cuda.is_available() else "cpu"
    kernel = {"batch": 1, "context": 300} if tiny else {"batch": 1, "context": 32 * 1024}
    fig7 = {"method": "PN-Mix", "step": 10 if tiny else 16 * 1024}
    fig6c = {"method": "PN-Mix", "batch": 1 if tiny else 20}
    properties = TINY_PROPERTIES if tiny else SHORT_PROPERTIES
    conformance_json = out / f"conformance-triton-{stamp}.json"

    def bench(name: str, ids: list[str]) -> tuple[tuple[str, ...], str]:
        path = out / f"bench-{safe}-{stamp}-{name}.json"
        return (*ids, "--benchmark-only", "--budget-gib", str(budget_gib), "--benchmark-json", str(path)), str(path)

    kernel_ids = [
        point_id(SUITES["kernels"], "test_decode_attention_bandwidth", kernel_decode, scale, method=m, **kernel)
        for m in names(tag="fig6")
    ]
    fig7_id = point_id(SUITES["latency"], "test_fig7_step_latency", fig7_latency, scale, **fig7)
    fig6c_id = point_id(SUITES["throughput"], "test_fig6c_throughput", fig6c_throughput, scale, **fig6c)
    launch_ids = [f"{SUITES['kernels']}::test_decode_launch_choice[{w.id}]" for w in kernel_launch(SCALES[scale])]
    ptx_ids = [f"{PTX_SUITE}::test_decode_with_and_without_the_ptx_unpack[{w.id}]" for w in kernel_ptx(SCALES[scale])]
    conformance = (
        "conformance",
        "--ignore=conformance/meta",
        "--impl",
        "triton",
        "--device",
        dev,
        "--impl",
        "triaxialkv-triton",
        "--impl",
        "role-aware-pnmix-triton",
        "--hypothesis-profile",
        "ci",
        "-k",
        " or ".join(properties),
        "--conformance-json",
        str(conformance_json),
    )
    capture_xml = out / f"capture-{safe}-{stamp}.xml"
    capture = (*CAPTURE_TESTS, "--junitxml", str(capture_xml))
    what = {
        "conformance": f"compiled conformance of the Triton implementation: {', '.join(properties)}",
        "capture": "a captured decode step replayed across page completions, checks included, against eager",
        "kernel": "decode-attention bandwidth against this device's copy bandwidth",
        "fig7": "one Fig. 7 point: eager step and CUDA-graph replay",
        "fig6c": "one Fig. 6c point: tokens/s",
        "ptx": "the decode kernel with the PTX unpack asked for and not: the path each took (the self-test's "
        "outcome), errors by property 7's rule, same bits or not, times",
        "launch": "the decode kernel at each launch choice of benchmarks.efficiency.workloads.LAUNCH_GRID: "
        "bandwidth and error",
    }
    return [
        Step("conformance", BUDGET_S["conformance"], what["conformance"], conformance, str(conformance_json)),
        Step("capture", BUDGET_S["capture"], what["capture"], capture, str(capture_xml)),
        Step("kernel", BUDGET_S["kernel"], what["kernel"], *bench("kernel", kernel_ids)),
        Step("fig7", BUDGET_S["fig7"], what["fig7"], *bench("fig7", [fig7_id])),
        Step("fig6c", BUDGET_S["fig6c"], what["fig6c"], *bench("fig6c", [fig6c_id])),
        Step("ptx", BUDGET_S["ptx"], what["ptx"], *bench("ptx", ptx_ids)),
        Step("launch", BUDGET_S["launch"], what["launch"], *bench("launch", launch_ids)),
    ]


#: The CUDA-graph tests of the decode step (skipped, saying why, without CUDA), then the evaluation path
#: on the Triton caches: chunks stepwise, a context's checkpoint returned to, and lm-eval's scores through
#: impl=triton against the spec within property 7's rule.
CAPTURE_TESTS = (
    "pnmix/tests/test_capturable.py::test_one_captured_step_replays_across_page_completions",
    "pnmix/tests/test_sync_free.py::test_a_checked_decode_step_is_captured_and_replays_its_checks",
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


def run_pytest(args: list[str] | tuple[str, ...], timeout_s: float | None = None) -> dict:
    """Run pytest as a step (`benchmarks.commands.subprocesses.run`: output streamed, its end kept for
    `reason`; past timeout_s interrupted, pytest then writes its results) and say how it ended."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", *args]
    ended = subprocesses.run(cmd, echo=True, timeout_s=timeout_s, grace_s=GRACE_S)
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


def run_short(args, out: Path, stamp: str, safe: str) -> dict[str, dict]:
    wanted = [s for s in args.steps if not (args.skip_conformance and s == "conformance")]
    steps = [s for s in short_steps(args.tiny, out, stamp, safe, args.budget_gib) if s.name in wanted]
    start, done = time.monotonic(), {}
    for step in steps:
        left = args.time_budget - (time.monotonic() - start)
        command = " ".join(["pytest", "-q", *step.args])
        print(f"gpu_check: {step.name}: budget {step.budget_s} s, {left:.0f} s left: {step.what}", flush=True)
        if step.budget_s > left:
            optional = " (optional: no failure)" if step.name in OPTIONAL else ""
            done[step.name] = {
                "command": command,
                "exit_code": None,
                "seconds": 0.0,
                "timed_out": False,
                "status": f"skipped: would overrun ({step.budget_s} s budget, {left:.0f} s left of "
                f"{args.time_budget:g} s){optional}",
            }
        else:
            ran = run_pytest(step.args, timeout_s=step.budget_s)
            status = "timed out" if ran["timed_out"] else "passed" if ran["exit_code"] == 0 else "failed"
            done[step.name] = {**ran, "status": status}
        done[step.name] |= {
            "budget_s": step.budget_s,
            "what": step.what,
            "json": step.json,
            "results": summarize(Path(step.json)),
        }
        print(
            f"gpu_check: {step.name}: {done[step.name]['status']} after {done[step.name]['seconds']} s "
            f"(budget {step.budget_s} s)",
            flush=True,
        )
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for the results")
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
    out = preflight.output_folder(parser, args.out)
    device = torch.device("cuda" if cuda else "cpu")
    safe = "".join(ch if ch.isalnum() else "-" for ch in device_name(device)).strip("-")[:40]
    stamp = utc_stamp()
    if args.short:
        steps = run_short(args, out, stamp, safe)
        result = record(
            "gpu-check",
            device,
            mode="short",
            scale="tiny" if args.tiny else "full",
            time_budget_s=args.time_budget,
            budget_gib=args.budget_gib,
            steps=steps,
        )
    else:
        result = record("gpu-check", device, mode="suites", steps={})
        steps = result["steps"]
        if cuda and not args.skip_conformance:
            steps["conformance"] = run_pytest(
                [
                    "conformance",
                    "pnmix",
                    "--impl",
                    "triton",
                    "--impl",
                    "triaxialkv-triton",
                    "--impl",
                    "role-aware-pnmix-triton",
                    "--device",
                    "cuda",
                    "--ignore=conformance/meta",
                    "--conformance-json",
                    str(out / f"conformance-triton-{stamp}.json"),
                ]
            )
        bench_json = out / f"bench-{safe}-{stamp}.json"
        steps["benchmarks"] = run_pytest(
            [
                *(SUITES[s] for s in args.suites),
                "--benchmark-only",
                "--bench-scale",
                "tiny" if args.tiny else "full",
                "--bench-sweep",
                args.sweep,
                "--budget-gib",
                str(args.budget_gib),
                "--benchmark-json",
                str(bench_json),
            ]
        )
        steps["benchmarks"]["json"] = str(bench_json)
    for name, step in result["steps"].items():  # first: on screen whatever happens to the record
        print(f"gpu_check: {name}: exit {step['exit_code']} in {step['seconds']} s: {step['command']}")
        if step.get("results"):
            print(tabulate(step["results"], headers="keys", tablefmt="github", floatfmt=".4g"))
    (path,) = save(parser.prog, out, {f"gpu-check-{safe}-{stamp}.json": lambda p: write_json(p, result)})
    print(f"gpu_check: written to {path}")
    failed = [
        name
        for name, step in result["steps"].items()
        if step["exit_code"] != 0 and not (name in OPTIONAL and step["exit_code"] is None)
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
