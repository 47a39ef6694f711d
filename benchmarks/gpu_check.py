"""GPU check of the Triton implementation: compiled conformance and a decode-attention microbenchmark.

    python -m benchmarks.gpu_check [--out DIR] [--skip-conformance] [--tiny]

With CUDA: runs `pytest conformance --impl triton` and the kernel tests compiled, then times
PNMixCache.attend (triton.testing.do_bench, median) for PN-Mix, KIVI-2 and Kitty at B in
{1, 32, 110} and contexts {1K, 8K, 32K} for one Qwen3-8B attention layer (8 KV heads, 32
query heads, head_dim 128), next to FP16 scaled_dot_product_attention on the same shapes and
the device's measured copy bandwidth. Bytes read by a quantized cache are its bytes from
reference.storage (packed keys and values, scales, zeros, selection metadata, sinks,
residual) plus q and the output. --tiny runs the same
harness on small shapes without CUDA (Triton interpreter, wall-clock timing, not predictive).
Results go to a new JSON file named with the device and UTC time; nothing is overwritten.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate
from tqdm import tqdm

from reference import storage_model
from reference.methods import METHODS
from reports.files import utc_stamp, write_json

PROMPT = 141
QUANTIZED = ("PN-Mix", "KIVI-2", "Kitty")  # timed on the same Triton decode kernel
# layer: (KV heads, query heads per KV head, head_dim); Qwen3-8B's for the real run.
FULL = {"batches": (1, 32, 110), "contexts": (1024, 8192, 32768), "chunk": 4096, "layer": (8, 4, 128)}
TINY = {"batches": (2,), "contexts": (300,), "chunk": 128, "layer": (2, 2, 64)}  # sinks, 2 pages, residual


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("triton", "transformers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def timer(fn, cuda: bool) -> float:
    """Median milliseconds of fn: do_bench on CUDA (flushes L2), wall clock otherwise."""
    if cuda:
        import triton.testing

        return float(triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])[0])
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def copy_bandwidth(cuda: bool, nbytes: int) -> float:
    """GB/s of a device-to-device copy (read + write) of nbytes, this run, this device."""
    device = "cuda" if cuda else "cpu"
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), cuda)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def build_cache(method: str, batch: int, context: int, chunk: int, layer: tuple, device: str):
    from pnmix import PNMixCache

    kv_heads, n_rep, head_dim = layer
    gen = torch.Generator(device=device).manual_seed(batch * 7919 + context)
    shape = lambda heads, n: (batch, heads, n, head_dim)  # noqa: E731
    rand = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=torch.float16)  # noqa: E731
    prompt = min(PROMPT, context)
    cache = PNMixCache.from_prefill(
        rand(*shape(kv_heads * n_rep, prompt)),
        rand(*shape(kv_heads, prompt)),
        rand(*shape(kv_heads, prompt)),
        METHODS[method](),
    )
    while cache.length < context:
        n = min(chunk, context - cache.length)
        cache.append(rand(*shape(kv_heads, n)), rand(*shape(kv_heads, n)))
    return cache, rand(*shape(kv_heads * n_rep, 1))


def microbenchmark(cfg: dict, cuda: bool) -> list[dict]:
    """One row per (method, batch, context): median ms, bytes read, effective GB/s."""
    device = "cuda" if cuda else "cpu"
    kv_heads, _, head_dim = cfg["layer"]
    rows = []
    points = [(b, c) for b in cfg["batches"] for c in cfg["contexts"]]

    def row(method, batch, context, ms, nbytes):
        return {"method": method, "batch": batch, "context": context, "ms": ms, "bytes": nbytes,
                "gbps": nbytes / (ms * 1e-3) / 1e9}  # fmt: skip

    for batch, context in tqdm(points, desc="decode attention", unit="point"):
        q = None
        for method in QUANTIZED:
            cache, q = build_cache(method, batch, context, cfg["chunk"], cfg["layer"], device)
            nbytes = storage_model(METHODS[method](), batch, kv_heads, head_dim, context).total + 2 * q.numel() * 2
            rows.append(row(method, batch, context, timer(lambda c=cache, x=q: c.attend(x), cuda), nbytes))
            del cache
        k = torch.randn(batch, kv_heads, context, head_dim, device=device, dtype=torch.float16)
        v = torch.randn_like(k)
        sdpa = lambda x=q, kk=k, vv=v: torch.nn.functional.scaled_dot_product_attention(x, kk, vv, enable_gqa=True)  # noqa: E731
        rows.append(row("FP16 (SDPA)", batch, context, timer(sdpa, cuda), 2 * k.numel() * 2 + 2 * q.numel() * 2))
        del k, v
        if cuda:
            torch.cuda.empty_cache()
    return rows


def run_conformance(out: Path) -> dict:
    """The conformance suite and kernel tests, compiled, with their JSON result kept in out/."""
    cmd = [sys.executable, "-m", "pytest", "conformance", "pnmix", "--impl", "triton", "--device", "cuda",
           "-p", "no:cacheprovider", "-q", "--ignore=conformance/meta", "--conformance-json",
           str(out / f"conformance-triton-{utc_stamp()}.json")]  # fmt: skip
    start = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    return {"command": " ".join(cmd[2:]), "exit_code": result.returncode, "summary": tail,
            "seconds": round(time.time() - start, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON result")
    parser.add_argument("--tiny", action="store_true", help="small shapes, no CUDA needed (harness check)")
    parser.add_argument("--skip-conformance", action="store_true")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_check: CUDA is not available; nothing to measure (use --tiny to exercise the harness)")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if cuda else f"cpu ({platform.machine()}), Triton interpreter"
    result = {
        "kind": "pnmix-gpu-check",
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name,
        "versions": versions(),
        "command": "python -m benchmarks.gpu_check" + (" --tiny" if args.tiny else ""),
        "timing": "triton.testing.do_bench median" if cuda else "wall clock median of 3 (not predictive)",
        "layer": dict(
            zip(
                ("kv_heads", "query_heads_per_kv_head", "head_dim"), (TINY if args.tiny else FULL)["layer"], strict=True
            )
        ),
    }
    if cuda and not args.skip_conformance:
        result["conformance"] = run_conformance(out)
    result["copy_gbps"] = copy_bandwidth(cuda, 2**31 if cuda and not args.tiny else 2**22)
    rows = microbenchmark(TINY if args.tiny else FULL, cuda)
    for row in rows:
        row["fraction_of_copy"] = row["gbps"] / result["copy_gbps"]
    result["decode_attention"] = rows
    safe = "".join(ch if ch.isalnum() else "-" for ch in device_name).strip("-")[:40]
    path = write_json(out / f"gpu-check-{safe}-{utc_stamp()}.json", result)
    print(f"device {device_name}; copy bandwidth {result['copy_gbps']:.0f} GB/s ({result['timing']})")
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".3g"))
    if "conformance" in result:
        print(f"conformance: exit {result['conformance']['exit_code']}: {result['conformance']['summary']}")
    print(f"written to {path}")
    return 0 if result.get("conformance", {}).get("exit_code", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
