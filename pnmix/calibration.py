"""What a GPU measured, and what `pnmix.perfmodel` predicts for it: the points the model is calibrated and checked on.

Each point is a decode kernel a GPU timed, named by the commit whose tree holds it, the configuration and the
workload it was timed at, and the measurement with its file. `historical_kernels` compiles that commit's own
kernels here (its tree from this repository's git history, its own launch code, run in a subprocess), so the
prediction is made from the machine code the GPU ran as closely as a CPU can (same source and launch; the
installed triton, which may differ from the one the GPU used: `Point.triton`). The model's one fitted constant,
`pnmix.perfmodel.LATENCY_FACTOR`, was set on these points; `pnmix/tests/test_calibration.py` holds every point within
`TOLERANCE` of its measurement, so a change of the model that moves a prediction away from what a GPU measured
fails there. When a GPU run times today's kernel, its point is added here.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pnmix import sass
from pnmix.gpus import GPUS
from pnmix.perfmodel import Kernel, Storage, Workload, decode_step

ROOT = Path(__file__).resolve().parents[1]
#: A prediction within this factor of the measurement (either way) holds.
TOLERANCE = 1.5


@dataclass(frozen=True)
class Point:
    label: str
    commit: str
    method: str
    dtype: str
    gpu: str
    workload: Workload
    measured_us: float
    graph_us: float | None
    triton: str
    source: str


POINTS = (
    Point(
        label="variant 6 (pnmix/kernels/NOTES.md)",
        commit="1e80b0d6ef45e998050b8949750cbc8d9ad94b94",
        method="PN-Mix",
        dtype="float16",
        gpu="H200",
        workload=Workload("Qwen3-8B layer, B=1, 32K", 1, 8, 4, 128, 32768),
        measured_us=109.616,
        graph_us=98.464,
        triton="3.6.0",
        source="benchmarks/results/h200-2026-11-30/bench-NVIDIA-H200-20261130T110239_133474Z-kernel.json: "
        "test_decode_attention_bandwidth[full-PN-Mix-B1-ctx32768], ms (median of CUDA-event times, L2 flushed); "
        "NVIDIA H200, torch 2.11.0, triton 3.6.0, 2026-11-30",
    ),
)


class Unavailable(RuntimeError):
    """The commit's tree cannot be had here (no git history, e.g. an installed package) or does not compile."""


_SCRIPT = r"""
import base64, json, sys
import torch
from pnmix import aot, _runtime
spec = json.loads(sys.argv[1])
case = aot.Case(spec["method"], spec["dtype"], 128, 4)
launches, layout = aot.record_launches(case, _runtime.Target(spec["arch"], spec["sms"]))
out = {}
for launch in launches:
    if launch.name in ("_split_kernel", "_merge_kernel") and launch.name not in out:
        compiled = aot._compile(launch, spec["arch"])
        consts = {k: v for k, v in launch.constexprs.items() if isinstance(v, (int, bool))}
        out[launch.name] = {"cubin": base64.b64encode(compiled.asm["cubin"]).decode(), "warps": launch.num_warps,
                            "shared": int(compiled.metadata.shared), "constexprs": consts}
block_n = out["_split_kernel"]["constexprs"]["BLOCK_N"]
cfg = layout.config
out["storage"] = {"n_sink": cfg.n_sink, "residual_length": cfg.residual_length, "group_size": cfg.group_size,
                  "bytes_per_token": aot.tile_bytes(layout, block_n) / block_n}
print(json.dumps(out))
"""


def historical_kernels(point: Point, arch: int, sms: int) -> tuple[Kernel, Kernel, Storage]:
    """The split and merge kernels of `point.commit`'s tree for (method, dtype, d = 128, GQA 4), compiled for `arch`
    by that tree's own launch code, and its cache layout's storage. Raises `Unavailable` saying why."""
    if not (ROOT / ".git").exists():
        raise Unavailable(f"no git history at {ROOT} (an installed package): the calibration kernels are in it")
    with tempfile.TemporaryDirectory(prefix="pnmix-calibration-") as tmp:
        archive = Path(tmp) / "tree.tar"
        done = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "-o", str(archive), point.commit, "pnmix", "reference"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise Unavailable(f"git archive {point.commit[:7]}: {done.stderr.strip() or 'failed'}")
        with tarfile.open(archive) as tar:  # our own tree: the "data" filter where this Python has it
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        spec = {"method": point.method, "dtype": point.dtype, "arch": arch, "sms": sms}
        env = dict(os.environ, PYTHONPATH=tmp, TRITON_INTERPRET="0")
        ran = subprocess.run(
            [sys.executable, "-c", _SCRIPT, json.dumps(spec)], capture_output=True, text=True, env=env, cwd=tmp
        )
    if ran.returncode != 0:
        tail = ran.stderr.strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"compiling the kernels of {point.commit[:7]} failed: {tail[0]}")
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    kernels = []
    for name in ("_split_kernel", "_merge_kernel"):
        entry = got[name]
        cubin = base64.b64decode(entry["cubin"])
        usage = sass.resource_usage(cubin)
        registers = int(usage.split("REG:")[1].split()[0]) if "REG:" in usage else 255
        kernels.append(
            Kernel.of(
                sass.disassemble(cubin, encoding=True), registers, entry["shared"], entry["warps"], entry["constexprs"]
            )
        )
    s = got["storage"]
    return kernels[0], kernels[1], Storage(s["n_sink"], s["residual_length"], s["group_size"], s["bytes_per_token"])


def check(point: Point, latency_factor: float | None = None) -> dict:
    """The model's prediction at a calibration point beside its measurement (ratio predicted / measured)."""
    gpu = next(g for g in GPUS if g.name == point.gpu)
    split, merge, storage = historical_kernels(point, gpu.arch, gpu.sms)
    predicted = decode_step(split, merge, storage, point.workload, gpu, latency_factor=latency_factor)
    ratio = predicted["time_us"] / point.measured_us
    return {
        "label": point.label,
        "commit": point.commit[:7],
        "gpu": point.gpu,
        "workload": point.workload.name,
        "predicted_us": predicted["time_us"],
        "measured_us": point.measured_us,
        "ratio": round(ratio, 3),
        "holds": 1 / TOLERANCE <= ratio <= TOLERANCE,
        "prediction": predicted,
    }
