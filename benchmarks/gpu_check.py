"""One command for a GPU session: compiled conformance of the Triton implementation, then the
benchmark suites, with every result kept under benchmarks/results/.

    python -m benchmarks.gpu_check [--out DIR] [--sweep short|all] [--suites NAME ...]
                                   [--skip-conformance] [--tiny] [--budget-gib 40]

With CUDA: `pytest conformance pnmix --impl triton --device cuda` (kernels compiled, checked
against the spec), then `pytest benchmarks/suites --bench-scale full` (the short sweep by
default: every kernel point and the Fig. 6/7 points that decide the paper's claims).
--tiny runs the suites at tiny scale instead (no CUDA needed: the harness check). Results:
`conformance-triton-<time>.json`, `bench-<device>-<time>.json` (pytest-benchmark JSON) and
`gpu-check-<device>-<time>.json` (what ran, how it ended); nothing is overwritten.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from reference.records import device_name, record, utc_stamp, write_json

from .memory import DEFAULT_BUDGET_GIB

SUITES = {
    "memory": "benchmarks/suites/test_fig6_memory.py",
    "throughput": "benchmarks/suites/test_fig6c_throughput.py",
    "latency": "benchmarks/suites/test_fig7_latency.py",
    "kernels": "benchmarks/suites/test_kernels.py",
}


def run_pytest(args: list[str]) -> dict:
    """Run pytest in a subprocess (output streamed) and say how it ended."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    start = time.time()
    exit_code = subprocess.run(cmd).returncode
    return {"command": " ".join(["pytest", *cmd[5:]]), "exit_code": exit_code, "seconds": round(time.time() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for the results")
    parser.add_argument("--tiny", action="store_true", help="tiny scale, no CUDA needed (harness check)")
    parser.add_argument("--sweep", choices=("short", "all"), default="short")
    parser.add_argument("--suites", nargs="+", choices=sorted(SUITES), default=sorted(SUITES))
    parser.add_argument("--budget-gib", type=float, default=DEFAULT_BUDGET_GIB)
    parser.add_argument("--skip-conformance", action="store_true")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_check: CUDA is not available; nothing to measure (use --tiny to exercise the harness)")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if cuda else "cpu")
    safe = "".join(ch if ch.isalnum() else "-" for ch in device_name(device)).strip("-")[:40]
    stamp = utc_stamp()
    result = record("gpu-check", device, steps={})
    if cuda and not args.skip_conformance:
        result["steps"]["conformance"] = run_pytest(
            [
                "conformance",
                "pnmix",
                "--impl",
                "triton",
                "--device",
                "cuda",
                "--ignore=conformance/meta",
                "--conformance-json",
                str(out / f"conformance-triton-{stamp}.json"),
            ]
        )
    bench_json = out / f"bench-{safe}-{stamp}.json"
    result["steps"]["benchmarks"] = run_pytest(
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
    result["steps"]["benchmarks"]["json"] = str(bench_json)
    path = write_json(out / f"gpu-check-{safe}-{stamp}.json", result)
    for name, step in result["steps"].items():
        print(f"gpu_check: {name}: exit {step['exit_code']} in {step['seconds']} s: {step['command']}")
    print(f"gpu_check: written to {path}")
    return 0 if all(step["exit_code"] == 0 for step in result["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
