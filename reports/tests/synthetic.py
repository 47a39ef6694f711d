"""Small synthetic result files in the schemas the report reads, with numbers chosen so that every
derived figure (slopes, ratios, verdicts) is known by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from benchmarks.fidelity import long_output as bench_long
from reference import records

DEVICE = "NVIDIA Test GPU"
COMMAND = "pytest benchmarks/suites --benchmark-only --benchmark-json gpu.json"
FIG7_STEPS = (1024, 11 * 1024, 21 * 1024, 31 * 1024, 32 * 1024 - 16)
#: step_ms = base + slope_us * 1e-3 * step, exactly linear: the fitted slope must be slope_us.
FIG7 = {"FP16": (40.0, 3.0), "Kitty": (45.0, 2.38), "PN-Mix": (45.0, 2.17)}
#: tokens/s per (method, batch); None: out of memory.
FIG6C = {("FP16", 20): 500.0, ("FP16", 21): None, ("Kitty", 20): 450.0, ("PN-Mix", 20): 400.0, ("PN-Mix", 110): 1000.0}
#: kernel ms per (method, batch, context)
KERNEL = {("FP16", 1, 8192): 0.10, ("Kitty", 1, 8192): 0.05, ("PN-Mix", 1, 8192): 0.04}
COPY_GBPS = 4000.0
#: kernel launch choices (block_n, warps, stages, split factor): (ms, max error, fits); bound 0.01 everywhere.
LAUNCH = {
    (64, 4, 1, 1): (0.10, 0.001, True),
    (64, 4, 2, 1): (0.08, 0.002, True),
    (32, 4, 2, 1): (0.05, 0.5, True),
    (128, 8, 3, 1): (None, None, False),
}
#: `reference.records.machine` of the run that wrote a file.
MACHINE = {
    "platform": "Linux-6.8-x86_64",
    "cpu": "x86_64, 16 logical cores",
    "memory": "128.0 GiB",
    "gpu": DEVICE,
    "cuda": "12.8",
    "TRITON_INTERPRET": "unset",
}


def _bench(name: str, info: dict, median_s: float = 1.0) -> dict:
    return {
        "name": name,
        "group": info["suite"],
        "params": {},
        "stats": {"median": median_s, "min": median_s},
        "extra_info": info,
    }


def _info(suite: str, method: str, scale: str = "full", **figures) -> dict:
    return {
        "suite": suite,
        "scale": scale,
        "device": DEVICE if scale == "full" else "cpu (x86_64)",
        "machine": MACHINE,
        "versions": {"python": "3.11", "torch": "2.13", "triton": "3.7", "transformers": "5.2"},
        "date_utc": "2026-12-01T10:00:00+00:00",
        "command": COMMAND,
        "model": "Qwen3-8B",
        "method": method,
        "attention": "test",
        "method_config": {},
        "timing": "cuda events",
        **figures,
    }


def step_ms(method: str, step: int) -> float:
    base, slope_us = FIG7[method]
    return base + slope_us * 1e-3 * step


def gpu_benchmarks() -> dict:
    """A pytest-benchmark JSON of a full-scale GPU run: Fig. 6c, Fig. 7, kernel and Fig. 6 memory points."""
    benches = []
    for (m, b), tps in FIG6C.items():
        benches.append(
            _bench(
                f"tp[{m}-{b}]",
                _info(
                    "fig6c-throughput",
                    m,
                    batch=b,
                    prompt=141,
                    generation=8192,
                    protocol="sampled",
                    sample_lengths=[0, 8176],
                    step_ms=[1.0, 2.0],
                    prefill_ms=10.0,
                    total_s=None if tps is None else b * 8192 / tps,
                    tokens_per_s=tps,
                    oom=tps is None,
                ),
            )
        )
    for m in FIG7:
        for s in FIG7_STEPS:
            benches.append(
                _bench(f"lat[{m}-{s}]", _info("fig7-latency", m, batch=1, prompt=141, step=s, step_ms=step_ms(m, s)))
            )
    for (m, b, c), ms in KERNEL.items():
        nbytes = int(ms * 1e-3 * 1e9 * 1000)  # 1000 GB/s at every point
        benches.append(
            _bench(
                f"k[{m}]",
                _info(
                    "kernel",
                    m,
                    batch=b,
                    context=c,
                    ms=ms,
                    bytes=nbytes,
                    gbps=nbytes / (ms * 1e-3) / 1e9,
                    copy_gbps=COPY_GBPS,
                    fraction_of_copy=nbytes / (ms * 1e-3) / 1e9 / COPY_GBPS,
                    roofline_ms=ms / 2,
                    oom=False,
                ),
            )
        )
    for (bn, w, st, x), (ms, err, fits) in LAUNCH.items():
        figures = {"ms": ms, "gbps": None if ms is None else 1.0 / ms, "fraction_of_copy": None if ms is None else 0.1}
        if fits:
            figures |= {"max_error": err, "error_bound": 0.01, "splits": 4 * x}
        benches.append(
            _bench(
                f"launch[{bn}-{w}-{st}-{x}]",
                _info(
                    "kernel-launch",
                    "PN-Mix",
                    batch=1,
                    context=32768,
                    block_n=bn,
                    warps=w,
                    stages=st,
                    split_factor=x,
                    fits=fits,
                    copy_gbps=COPY_GBPS,
                    oom=False,
                    **figures,
                ),
            )
        )
    ptx = {"plain_path": "plain", "ptx_path": "ptx", "self_test": "self-test passed", "identical": True}
    ptx |= {"plain_max_error": 1e-3, "ptx_max_error": 1e-3, "error_bound": 1e-2, "plain_ms": 0.05, "ptx_ms": 0.04}
    benches.append(
        _bench(
            "ptx[B1-32768]",
            _info("kernel-ptx", "PN-Mix", batch=1, context=32768, bytes=10**8, copy_gbps=COPY_GBPS, **ptx),
        )
    )
    for m, b, g, oom, peak in (
        ("FP16", 20, 8192, False, 38.5),
        ("FP16", 21, 8192, True, None),
        ("PN-Mix", 110, 8192, False, 38.0),
    ):
        benches.append(
            _bench(
                f"mem[{m}-{b}]",
                _info(
                    "fig6-memory",
                    m,
                    batch=b,
                    prompt=141,
                    generation=g,
                    capacity=141 + g,
                    budget_gib=40.0,
                    oom=oom,
                    peak_allocated_gib=peak,
                    peak_reserved_gib=peak,
                    model_peak_gib=37.0,
                    weights_gib=15.26,
                    cache_gib=1.0,
                ),
            )
        )
    return {
        "machine_info": {"machine": "x86_64"},
        "commit_info": {},
        "datetime": "2026-12-01T10:00:00",
        "version": "5.3.1",
        "benchmarks": benches,
    }


def eval_speed_benchmarks(beside: dict[str, float] | None = None) -> dict:
    """A CPU evaluation-speed run: an item at 1024 tokens per method, FP16 through the path the baseline;
    `beside`: FP16's seconds timed beside each method in its own test (files written since that was kept)."""
    seconds = {"FP16": 8.0, "PN-Mix": 8.8, "KIVI-2": 10.4}
    benches = [
        _bench(
            f"speed[{m}]",
            {
                **_info("eval-speed", m, work="item", length=1024, threads=1, seconds=s),
                "device": "cpu (x86_64)",
                "timing": "wall clock, one CPU thread",
                **({} if beside is None else {"fp16_seconds": beside[m]}),
            },
        )
        for m, s in seconds.items()
    ]
    return {"machine_info": {}, "commit_info": {}, "datetime": "2026-12-01T10:00:00", "benchmarks": benches}


def tiny_benchmarks() -> dict:
    """A CPU tiny-harness run: one Fig. 7 point per method, plus a benchmark outside the schema."""
    benches = [
        _bench(
            f"lat[{m}]",
            _info("fig7-latency", m, scale="tiny", batch=1, prompt=40, step=10, step_ms=float(i + 1)),
            median_s=0.5,
        )
        for i, m in enumerate(("FP16", "PN-Mix"))
    ]
    benches.append(
        {"name": "test_fig6_feasibility_model", "stats": {"median": 0.1}, "extra_info": {"suite": "fig6-model"}}
    )
    return {
        "machine_info": {"machine": "x86_64"},
        "commit_info": {},
        "datetime": "2026-12-01T10:00:00",
        "benchmarks": benches,
    }


def conformance() -> dict:
    """Two implementations: every outcome the matrix shows."""

    def rec(impl, prop, outcome, reason="", measured=None):
        return {
            "implementation": impl,
            "version": "0",
            "property": prop,
            "module": "conformance/test_p1_packing.py",
            "nodeid": f"conformance/test_p1_packing.py::{prop}[{impl}]",
            "outcome": outcome,
            "reason": reason,
            "duration_s": 0.5,
            "hypothesis_statistics": None,
            "measured": measured or {},
        }

    results = [
        rec("reference", "test_a", "passed", measured={"spec_distance": 0.0}),
        rec("triton", "test_d", "passed", measured={"spec_distance": 0.00125}),
        rec("triton", "test_d", "passed", measured={"spec_distance": 0.0005}),
        rec("reference", "test_b", "passed"),
        rec("triton", "test_a", "failed", "AssertionError: codes differ | at 3"),
        rec("triton", "test_b", "skipped", "triton does not claim bf16\nmore detail"),
        rec("reference", "test_c", "xfailed", "known failure listed in reference.txt"),
    ]
    return {
        "kind": "pnmix-conformance",
        "date_utc": "2026-12-01T10:00:00+00:00",
        "device": "cpu (x86_64)",
        "command": "pytest conformance --impl reference --impl triton",
        "versions": {"python": "3.11", "torch": "2.13", "hypothesis": "6.100"},
        "machine": {**MACHINE, "gpu": "none", "TRITON_INTERPRET": "1"},
        "implementations": ["reference", "triton"],
        "implementation_details": [
            {"name": "reference", "version": "0.3.0", "origin": "reference = reference.contract.implementation:make"},
            {"name": "triton", "version": "0.3.0", "origin": "triton = pnmix.protocol:make (pnmix 0.3.0)"},
        ],
        "hypothesis_profile": "ci",
        "exitstatus": 1,
        "results": results,
    }


def gpu_check(bench_name: str = "bench-GPU-1.json") -> dict:
    """A `python -m benchmarks.gpu_check` record: the steps it ran; its figures are in `bench_name`."""
    return {
        "kind": "pnmix-gpu-check",
        "date_utc": "2026-12-01T11:00:00+00:00",
        "device": "NVIDIA Check GPU",
        "machine": {**MACHINE, "gpu": "NVIDIA Check GPU"},
        "versions": {},
        "command": "python -m benchmarks.gpu_check",
        "steps": {
            "conformance": {"command": "pytest conformance pnmix --impl triton", "exit_code": 0, "seconds": 120.0},
            "benchmarks": {
                "command": "pytest benchmarks/suites --bench-scale full",
                "exit_code": 1,
                "seconds": 300.0,
                "json": f"benchmarks/results/{bench_name}",
            },
        },
    }


def current(data: dict) -> dict:
    """`data` recording, as the code it measured, a file of this tree as it is: the report compares it."""
    code = records.code_fingerprint("reference.equations.quant")
    data = copy.deepcopy(data)
    for b in data.get("benchmarks", []):
        b["extra_info"]["code"] = code
    if "results" in data:
        data["code"] = code
        for d in data.get("implementation_details", []):
            d["code"] = code
    elif "benchmarks" not in data:
        data["code"] = code
    return data


def of_other_code(data: dict) -> dict:
    """`data` without the canaries that could keep it current: a measurement of code that is gone."""
    data = copy.deepcopy(data)
    data.pop("behaviour", None)
    return data


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def long_output(
    per_prompt: list[dict], positions: int, command: str = "python -m benchmarks.long_output", **fields
) -> dict:
    """A long-output result as `benchmarks.long_output` writes it, from each prompt's per-method series
    (`{"kl", "top1", "nll"}`, FP16 with `nll` alone) summarized over `positions` positions."""
    return records.record(
        "long-output",
        "cpu",
        command=command,
        model="M (x)",
        prompts=len(per_prompt),
        chunk=1,
        **fields,
        summary=bench_long.summarize(per_prompt, positions),
        per_prompt=per_prompt,
    )


def task_accuracy() -> dict:
    """Two tasks (one where FP16 is near chance) and runs whose verdicts are known by construction:
    PN-Mix equals FP16 at every budget, KIVI loses 10 of 40 items below 2.25 bits, keys only lose 10,
    values only none."""
    fp16_a = [1] * 36 + [0] * 4  # 0.90 on a 4-way task
    fp16_b = [1] * 10 + [0] * 30  # 0.25: chance
    worse = [0] * 10 + fp16_a[10:]  # the first 10 right answers lost

    def run(label, role, key_bits, a, budget=None, value_bits=2.5):
        return {
            "label": label,
            "role": role,
            "key_bits": key_bits,
            "value_bits": value_bits,
            "budget": budget,
            "method": label.split(" @")[0],
            "model_args": "method=x",
            "results": {"a_1k": {"correct": a}, "b_1k": {"correct": fp16_b}},
        }

    runs = [run("FP16", "baseline", 16.0, fp16_a, value_bits=16.0)]
    for budget in (3.0, 2.25, 1.5):
        runs.append(run(f"PN-Mix @ {budget:g}", "budget", budget + 0.01, fp16_a, budget))
        runs.append(run(f"KIVI @ {budget:g}", "budget", budget, fp16_a if budget > 2.25 else worse, budget))
    runs.append(run("keys only (2-bit keys, exact values)", "table 8", 2.5, worse, value_bits=16.0))
    runs.append(run("values only (2-bit values, 8-bit keys)", "table 8", 8.25, fp16_a))
    return {
        "kind": "pnmix-task-accuracy",
        "model": "TinyLM",
        "model_fingerprint": "sha256:00",
        "device": "cpu (x86_64)",
        "date_utc": "2026-12-01T10:00:00+00:00",
        "command": "python -m benchmarks.task_accuracy --model tiny",
        "versions": {"python": "3.11"},
        "machine": MACHINE,
        "tasks": [{"name": "a_1k", "items": 40, "chance": 0.25}, {"name": "b_1k", "items": 40, "chance": 0.25}],
        "runs": runs,
    }


#: Text a result file may carry in any name, device or command: a new table row, HTML, a formula that
#: does not parse, a control character.
HOSTILE = "x\n| injected | row |\r\n<script>alert(1)</script> & <b>b</b> $\\frac{$ \x1b[31m"
#: The keys whose text the report shows (names, devices, commands, reasons, labels).
SHOWN_TEXT = (
    "implementation",
    "implementations",
    "device",
    "command",
    "model",
    "reason",
    "example",
    "name",
    "label",
    "method",
    "version",
    "origin",
    "date_utc",
    "protocol",
    "timing",
    "config",
    "claim",
    "evidence",
    "warnings",
    "model_fingerprint",
    "realistic_workload",
    "datetime",
    "brand_raw",
)


#: Methods the report's schemas require by name (`reports.schema`).
REQUIRED_METHODS = ("FP16", "TriAxialKV", "PN-Mix", "role-aware PN-Mix", "KIVI", "Kitty")


def hostile(data: object, keys: tuple[str, ...] = SHOWN_TEXT, text: str = HOSTILE) -> object:
    """`data` with `text` appended to every text under `keys` (and in lists of text under them), and to
    the names of tasks and of methods (dict keys the sections show) other than those the schemas require."""

    def spoil(value: object) -> object:
        if isinstance(value, str):
            return value if value in REQUIRED_METHODS else value + text
        return [spoil(v) for v in value] if isinstance(value, list) else value

    def walk(value: object, under: str = "") -> object:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                key = k + text if under in ("methods", "results") and k not in REQUIRED_METHODS else k
                out[key] = spoil(v) if k in keys and not isinstance(v, dict) else walk(v, k)
            return out
        return [walk(v) for v in value] if isinstance(value, list) else value

    return walk(data)
