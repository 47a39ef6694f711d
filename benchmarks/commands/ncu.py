"""The decode kernel under Nsight Compute, for the kernel step of `python -m benchmarks.gpu_check --short`: its
achieved DRAM throughput and its top warp stall reasons, where `ncu` is on PATH.

`command` profiles the first launch of the decode kernel (`--kernel-name regex:_split_kernel --launch-count 1`) of
`python -m benchmarks.commands.ncu --batch B --context T`, which builds the kernel step's PN-Mix cache on the GPU
(`benchmarks.efficiency.harness.build_decode_cache`) and attends once; ncu collects `METRICS` (DRAM throughput as a
percentage of its peak, DRAM bytes read, the kernel's duration) and `STALLS` (the WarpStateStats section's
metrics: cycles each warp spent stalled for each reason, per issued instruction) and prints them as CSV
(`--csv`, its default "details" page: one row per kernel and metric, with its unit and value; `--print-units
base`: bytes and nanoseconds). `parse_csv` reads that output and `summary` keeps the figures and the top stalls.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import sys

import torch

from benchmarks.efficiency import harness
from benchmarks.efficiency.workloads import FULL, _layer
from reference.cli import positive_int

KERNEL = "_split_kernel"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_READ = "dram__bytes_read.sum"
DURATION = "gpu__time_duration.sum"
METRICS = (DRAM_PCT, DRAM_READ, DURATION)
#: The warp stall reasons of Nsight Compute's WarpStateStats section (its "Warp State" chart), by reason.
STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)
STALLS = tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS)
#: The columns of ncu's --csv details page that `parse_csv` reads.
COLUMNS = ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
#: Values in other units, to the base unit ncu prints with --print-units base.
UNIT_SCALE = {
    "byte": 1,
    "Kbyte": 1e3,
    "Mbyte": 1e6,
    "Gbyte": 1e9,
    "nsecond": 1,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
}
TOP_STALLS = 5


def find() -> str | None:
    """The ncu on PATH, or None."""
    return shutil.which("ncu")


def command(ncu: str, batch: int, context: int, python: str = sys.executable) -> list[str]:
    """The ncu command line that profiles the decode kernel of the kernel step's point (B = batch, context tokens)."""
    return [
        ncu,
        "--csv",
        "--print-units",
        "base",
        "--kernel-name",
        f"regex:{KERNEL}",
        "--launch-count",
        "1",
        "--metrics",
        ",".join((*METRICS, *STALLS)),
        python,
        "-m",
        "benchmarks.commands.ncu",
        "--batch",
        str(batch),
        "--context",
        str(context),
    ]


def parse_csv(text: str) -> dict[str, dict[str, tuple[str, float | str]]]:
    """ncu's --csv details output (its own `==PROF==` lines and anything before the header skipped) as
    {kernel: {metric: (unit, value)}}; a value is a float where it reads as a number (thousands separators
    dropped), else the text. ValueError: no header, or a column missing."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise ValueError('ncu printed no CSV header (a line starting with "ID")')
    rows = csv.DictReader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"'))))
    missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
    if missing:
        raise ValueError(f"ncu's CSV lacks the columns {', '.join(missing)}")
    out: dict[str, dict[str, tuple[str, float | str]]] = {}
    for row in rows:
        raw = row["Metric Value"].replace(",", "")
        try:
            value: float | str = float(raw) * UNIT_SCALE.get(row["Metric Unit"], 1)
        except ValueError:
            value = row["Metric Value"]
        unit = "byte" if row["Metric Unit"] in ("Kbyte", "Mbyte", "Gbyte") else row["Metric Unit"]
        unit = "nsecond" if unit in ("usecond", "msecond", "second") else unit
        out.setdefault(row["Kernel Name"], {})[row["Metric Name"]] = (unit, value)
    return out


def summary(parsed: dict[str, dict[str, tuple[str, float | str]]]) -> dict:
    """The decode kernel's figures: DRAM throughput (% of peak), DRAM bytes read, duration (ns), achieved GB/s
    (bytes read / duration) and the top stall reasons (cycles per issued instruction, largest first).
    ValueError when no kernel named `KERNEL` was profiled."""
    kernel = next((name for name in parsed if KERNEL in name), None)
    if kernel is None:
        raise ValueError(f"ncu profiled no {KERNEL} (kernels: {', '.join(parsed) or 'none'})")
    metrics = parsed[kernel]

    def number(name: str) -> float | None:
        value = metrics.get(name, (None, None))[1]
        return value if isinstance(value, float) else None

    read, duration = number(DRAM_READ), number(DURATION)
    stalls = sorted(
        ((reason, number(metric)) for reason, metric in zip(STALL_REASONS, STALLS, strict=True)),
        key=lambda item: -(item[1] or 0.0),
    )
    stalls = [(reason, value) for reason, value in stalls if value]  # reported, and stalled at all
    return {
        "kernel": kernel,
        "dram_throughput_pct_of_peak": number(DRAM_PCT),
        "dram_bytes_read": read,
        "duration_ns": duration,
        "dram_read_gbps": read / duration if read is not None and duration else None,
        "top_stalls": [{"reason": r, "cycles_per_issue": v} for r, v in stalls[:TOP_STALLS]],
    }


def main(argv: list[str] | None = None) -> int:
    """The profiled program: the kernel step's PN-Mix cache on the GPU, attended once."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.commands.ncu", description=main.__doc__)
    parser.add_argument("--batch", type=positive_int, required=True)
    parser.add_argument("--context", type=positive_int, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: needs CUDA (it runs the decode kernel under ncu)\n")
    device = torch.device("cuda")
    cache, q = harness.build_decode_cache("PN-Mix", args.batch, args.context, _layer(FULL), device, FULL.prompt)
    cache.attend(q)
    torch.cuda.synchronize(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
