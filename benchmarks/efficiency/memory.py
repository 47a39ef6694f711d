"""Memory feasibility model of the paper's Fig. 6a/6b: which (method, batch, length) fit a GPU budget.

    pnmix-memory [--model Qwen3-8B] [--budget-gib 40] [--prompt 141] [--measured BENCH_JSON]

Peak memory = weights + the method's KV cache allocation + a workspace term:
- weights: `benchmarks.efficiency.architectures.Architecture.weight_bytes` (bf16), checked against transformers'
  own parameter count in the tests;
- cache: the paper's static protocol, every layer preallocated to max_cache_len = prompt +
  generation, with sinks, one residual page, scales, zeros and selection metadata: the same
  `reference.storage_model(..., capacity=)` that the conformance suite checks against the bytes
  a cache really holds;
- workspace: measured on a GPU when given (the `--workspace-gib` of a Fig. 6 run), otherwise the
  estimate of `workspace_estimate`, labelled as such: the largest transient tensors of a forward
  pass plus the generate loop's logits.
GiB throughout (the paper's "GB" are GiB, `reference.paper`). The paper's numbers are quoted from
`reference.paper`; the grids below are this project's sweeps around them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from benchmarks.efficiency.architectures import ARCHITECTURES, Architecture
from reference import storage_model
from reference.cli import positive_float, positive_int
from reference.methods import METHODS, NAMES
from reference.paper import (
    FIG6A_BATCH,
    FIG6A_MAX_GENERATION,
    FIG6B_GENERATION,
    FIG6B_MAX_BATCH,
    GPU,
    GPU_MEMORY_GIB,
    PROMPT,
)
from reference.records import GIB

DEFAULT_BUDGET_GIB = GPU_MEMORY_GIB  # the paper's A100-SXM4-40GB
FIG6A_GENERATION = (1024, 2048, 4096, 8192, 16384, 32768)
_FP16_MAX, _PNMIX_MAX = FIG6B_MAX_BATCH["FP16"][0], FIG6B_MAX_BATCH["PN-Mix"][0]
#: Both sides of each of the paper's Fig. 6b boundaries, and a few batches in between.
FIG6B_BATCHES = tuple(sorted({1, 8, 16, 32, 64, 128, _FP16_MAX, _FP16_MAX + 1, _PNMIX_MAX}))

#: Fig. 6a as the paper says it, from the quoted boundaries.
PAPER_FIG6A = {
    "FP16": f"out of memory beyond {FIG6A_MAX_GENERATION['FP16'] // 1024}K at B = {FIG6A_BATCH}",
    "PN-Mix": f"fits up to {FIG6A_MAX_GENERATION['PN-Mix'] // 1024}K at B = {FIG6A_BATCH}",
}


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Transient bytes of a generate step beyond weights and cache, and where the figure comes from."""

    bytes: int
    source: str  # "estimate: ..." or "measured: ..."


def workspace_estimate(arch: Architecture, batch: int, prompt: int, dense_attention_bytes: int = 0) -> Workspace:
    """An explicit estimate (not a measurement) of the transient peak of prefill and decode.

    Prefill of `prompt` tokens, one layer alive at a time in bf16: residual stream and its
    normed copy (2 B P h), q, k, v (B P (H + 2 H_kv) d), the SwiGLU gate, up and product
    (3 B P I); the last position's logits in bf16 plus the float32 copy generate keeps
    (B V (2 + 4)). Attention itself is fused (SDPA for the prompt, the split-K kernel for decode,
    whose partials are a few MiB), unless `dense_attention_bytes` says an implementation
    materialises a dense layer of K/V (a dequantize-then-attend design).
    """
    s = arch.shape
    tokens = batch * prompt
    layer = 2 * tokens * arch.hidden + tokens * (s.query_heads + 2 * s.kv_heads) * s.head_dim
    layer += 3 * tokens * arch.intermediate
    logits = batch * arch.vocab * (2 + 4)
    return Workspace(
        2 * layer + logits + dense_attention_bytes,
        "estimate: prefill activations of one layer + last-token logits (bf16 and fp32)"
        + (" + a dense bf16 K/V layer" if dense_attention_bytes else ""),
    )


#: GiB under the budget within which the model does not decide whether a point fits: what a card keeps from tensors
#: (the CUDA context with its library workspaces, the caching allocator's reserve and fragmentation) is not in the
#: model. The paper's own Fig. 6b bounds it from below: FP16 fit at 38.48 GiB (B = 20) and one more sequence, 1.16
#: GiB by this model, did not, so less than 39.64 GiB of the 40 was usable there.
UNDECIDED_GIB = 1.0


@dataclasses.dataclass(frozen=True)
class MemoryPoint:
    method: str
    batch: int
    prompt: int
    generation: int
    weights: int
    cache: int
    workspace: Workspace
    budget_gib: float

    @property
    def capacity(self) -> int:
        return self.prompt + self.generation

    @property
    def peak(self) -> int:
        return self.weights + self.cache + self.workspace.bytes

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget_gib * GIB

    @property
    def decided(self) -> bool | None:
        """Whether the point fits as far as the model can tell: True at least `UNDECIDED_GIB` under the budget,
        False over it, None in between (the card's own reserve decides, which the model does not hold)."""
        if self.peak > self.budget_gib * GIB:
            return False
        return True if self.peak <= (self.budget_gib - UNDECIDED_GIB) * GIB else None

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "batch": self.batch,
            "prompt": self.prompt,
            "generation": self.generation,
            "weights_gib": self.weights / GIB,
            "cache_gib": self.cache / GIB,
            "workspace_gib": self.workspace.bytes / GIB,
            "workspace_source": self.workspace.source,
            "peak_gib": self.peak_gib,
            "budget_gib": self.budget_gib,
            "fits": self.fits,
        }


def cache_bytes(arch: Architecture, method: str, batch: int, capacity: int) -> int:
    """Bytes of every layer's cache preallocated to `capacity` tokens (bf16 exact tokens): what
    `harness.measured_cache_bytes` of a real cache must equal."""
    s = arch.shape
    per_layer = storage_model(METHODS[method](), batch, s.kv_heads, s.head_dim, capacity, capacity=capacity)
    return s.layers * per_layer.total


def dense_layer_bytes(arch: Architecture, batch: int, capacity: int) -> int:
    """One layer's K and V in bf16 at full capacity: what a dequantize-then-attend design holds."""
    return 2 * batch * arch.shape.kv_heads * capacity * arch.shape.head_dim * 2


def point(
    arch: Architecture,
    method: str,
    batch: int,
    generation: int,
    *,
    prompt: int = PROMPT,
    budget_gib: float = DEFAULT_BUDGET_GIB,
    workspace: Workspace | None = None,
    dense_attention: bool = False,
    cache_fn=None,
) -> MemoryPoint:
    """Peak memory of one (method, batch, generation length) under the static protocol. cache_fn(batch,
    capacity): the cache's bytes, for a method outside `reference.methods` (then `method` only names it)."""
    for name, value in (("batch", batch), ("generation", generation), ("prompt", prompt)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if cache_fn is None and method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    if not budget_gib > 0:
        raise ValueError(f"budget_gib must be positive, got {budget_gib!r}")
    capacity = prompt + generation
    if workspace is None:
        dense = dense_layer_bytes(arch, batch, capacity) if dense_attention and method != "FP16" else 0
        workspace = workspace_estimate(arch, batch, prompt, dense)
    return MemoryPoint(
        method,
        batch,
        prompt,
        generation,
        arch.weight_bytes(),
        cache_bytes(arch, method, batch, capacity) if cache_fn is None else cache_fn(batch, capacity),
        workspace,
        budget_gib,
    )


def max_batch(arch: Architecture, method: str, generation: int, limit: int = 4096, **kwargs) -> MemoryPoint | None:
    """The largest batch that fits (peak grows with batch, so a bisection finds it); None if B = 1 does not."""
    if not point(arch, method, 1, generation, **kwargs).fits:
        return None
    lo, hi = 1, limit
    if point(arch, method, hi, generation, **kwargs).fits:
        return point(arch, method, hi, generation, **kwargs)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if point(arch, method, mid, generation, **kwargs).fits else (lo, mid)
    return point(arch, method, lo, generation, **kwargs)


def fig6a(arch: Architecture, methods: Sequence[str] = NAMES, **kwargs) -> list[MemoryPoint]:
    """Peak memory vs generation length at B = 32."""
    return [point(arch, m, FIG6A_BATCH, g, **kwargs) for g in FIG6A_GENERATION for m in methods]


def fig6b(
    arch: Architecture, methods: Sequence[str] = NAMES, batches: Sequence[int] = FIG6B_BATCHES, **kwargs
) -> list[MemoryPoint]:
    """Peak memory vs batch at L_gen = 8K."""
    return [point(arch, m, b, FIG6B_GENERATION, **kwargs) for b in batches for m in methods]


def longest_fitting(points: Sequence[MemoryPoint], method: str) -> int | None:
    """The longest generation of `points` at which `method` fits, when every shorter one fits too."""
    best = None
    for p in sorted((p for p in points if p.method == method), key=lambda p: p.generation):
        if not p.fits:
            break
        best = p.generation
    return best


def comparison(arch: Architecture, **kwargs) -> list[dict]:
    """The model next to the paper's Fig. 6a/6b points, one row per quoted claim."""
    a = fig6a(arch, tuple(PAPER_FIG6A), **kwargs)
    rows = []
    for method, quoted in PAPER_FIG6A.items():
        ours = longest_fitting(a, method)
        rows.append(
            {
                "figure": "6a",
                "method": method,
                "paper": quoted,
                "paper_value": FIG6A_MAX_GENERATION[method],
                "model": f"fits up to {ours // 1024}K" if ours else "does not fit at 1K",
                "model_value": ours,
                "agrees": ours == FIG6A_MAX_GENERATION[method],
            }
        )
    for method, (batch, gib) in FIG6B_MAX_BATCH.items():
        best = max_batch(arch, method, FIG6B_GENERATION, **kwargs)
        at_paper = point(arch, method, batch, FIG6B_GENERATION, **kwargs)
        rows.append(
            {
                "figure": "6b",
                "method": method,
                "paper": f"max B = {batch} ({gib:.2f} GiB)",
                "paper_value": batch,
                "model": f"max B = {best.batch} ({best.peak_gib:.2f} GiB)" if best else "B = 1 does not fit",
                "model_value": best.batch if best else 0,
                "agrees": bool(best) and best.batch == batch,
                "model_gib_at_paper_batch": at_paper.peak_gib,
                "paper_gib": gib,
            }
        )
    return rows


def explain(arch: Architecture, **kwargs) -> list[str]:
    """Sentences that say, from the numbers, where the model and the paper differ and the likely cause."""
    notes = []
    for row in comparison(arch, **kwargs):
        if row["figure"] != "6b":
            if not row["agrees"]:
                notes.append(f"Fig. 6a {row['method']}: paper {row['paper']}, model {row['model']}.")
            continue
        gap = row["paper_gib"] - row["model_gib_at_paper_batch"]
        notes.append(
            f"Fig. 6b {row['method']}: at the paper's B = {row['paper_value']} the model gives "
            f"{row['model_gib_at_paper_batch']:.2f} GiB against the measured {row['paper_gib']:.2f} GiB "
            f"({gap:+.2f} GiB unexplained by weights + cache + estimated workspace); "
            f"model {row['model']}, paper {row['paper']}."
        )
    fp16 = point(arch, "FP16", _FP16_MAX + 1, FIG6B_GENERATION, **kwargs)
    notes.append(
        f"FP16 at B = {fp16.batch}: the model needs {fp16.peak_gib:.2f} GiB, {fp16.budget_gib - fp16.peak_gib:.2f} GiB "
        f"under the {fp16.budget_gib:g} GiB budget, where the paper ran out of memory: a {DEFAULT_BUDGET_GIB:g} GiB "
        f"card does not give all of it to tensors (CUDA context, allocator reserve and fragmentation), so a boundary "
        f"this close to the budget is not decided by the model (--budget-gib below {fp16.peak_gib:.2f} reproduces "
        f"B = {fp16.batch - 1})."
    )
    batch, gib = FIG6B_MAX_BATCH["PN-Mix"]
    step = (
        point(arch, "PN-Mix", batch + 1, FIG6B_GENERATION, **kwargs).peak
        - point(arch, "PN-Mix", batch, FIG6B_GENERATION, **kwargs).peak
    )
    dense = dense_layer_bytes(arch, batch, PROMPT + FIG6B_GENERATION) / GIB
    notes.append(
        f"PN-Mix at B = {batch}: one more sequence costs {step / GIB:.2f} GiB by this model, so from the paper's own "
        f"{gib:.2f} GiB at B = {batch}, B = {batch + 1} would need about {gib + step / GIB:.2f} GiB, under "
        f"{DEFAULT_BUDGET_GIB:g}: the paper's B = {batch} reads as the largest batch it ran, not a memory boundary. "
        f"Its {gib - point(arch, 'PN-Mix', batch, FIG6B_GENERATION, **kwargs).peak_gib:.2f} GiB above this model is "
        f"of the size of a dense bf16 copy of one layer's keys ({dense / 2:.2f} GiB; keys and values {dense:.2f} "
        f"GiB), which a dequantize-then-attend implementation holds and our fused decode kernel does not."
    )
    return notes


def measured_workspaces(bench_json: dict) -> dict[tuple[str, int, int], Workspace]:
    """Workspace measured by a Fig. 6 GPU run (pytest-benchmark JSON): peak allocated minus weights
    and cache, by (method, batch, generation); points that ran out of memory have none."""
    out = {}
    for bench in bench_json.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if info.get("suite") != "fig6-memory" or info.get("workspace_measured_gib") is None:
            continue
        source = f"measured: {info['device']}, {info['date_utc']}, {info['command']}"
        key = (info["method"], info["batch"], info["generation"])
        out[key] = Workspace(round(info["workspace_measured_gib"] * GIB), source)
    return out


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


#: What a measured Fig. 6 point needs, and the check of each value.
MEASURED_FIELDS = {
    "method": lambda v: isinstance(v, str) and v in METHODS,
    "batch": _count,
    "generation": _count,
    "device": lambda v: isinstance(v, str),
    "date_utc": lambda v: isinstance(v, str),
    "command": lambda v: isinstance(v, str),
    "workspace_measured_gib": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
}


def measured_problems(bench_json: object) -> list[str]:
    """What keeps `measured_workspaces` from reading a file: one sentence per problem (none: it reads)."""
    benchmarks = bench_json.get("benchmarks") if isinstance(bench_json, dict) else None
    if not isinstance(benchmarks, list):
        return ["not a pytest-benchmark result: it has no 'benchmarks' list"]
    problems = []
    for i, bench in enumerate(benchmarks):
        info = bench.get("extra_info", {}) if isinstance(bench, dict) else None
        if not isinstance(info, dict):
            problems.append(f"benchmarks[{i}] is not a benchmark with an 'extra_info' object")
        elif info.get("suite") == "fig6-memory" and info.get("workspace_measured_gib") is not None:
            bad = [
                f"{k}={info[k]!r}" if k in info else f"no {k}"
                for k, ok in MEASURED_FIELDS.items()
                if k not in info or not ok(info[k])
            ]
            if bad:
                problems.append(f"benchmarks[{i}] (fig6-memory): {', '.join(bad)}")
    return problems


def read_measured(path: str) -> dict[tuple[str, int, int], Workspace]:
    """The measured workspaces of the file `--measured` names; ValueError with one line per problem."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"--measured {path}: cannot read it ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--measured {path}: not JSON ({err})") from None
    problems = measured_problems(data)
    if problems:
        shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
        raise ValueError("\n".join(f"--measured {path}: {p}" for p in shown))
    return measured_workspaces(data)


def _table(points: Sequence[MemoryPoint], key: str, methods: Sequence[str]) -> str:
    rows = {}
    for p in points:
        row = rows.setdefault(getattr(p, key), {key: getattr(p, key)})
        row[p.method] = f"{p.peak_gib:.2f}" + ("" if p.fits else " OOM")
    return tabulate(list(rows.values()), headers={key: key, **{m: m for m in methods}}, tablefmt="github")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pnmix-memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen3-8B", choices=sorted(ARCHITECTURES))
    p.add_argument("--budget-gib", type=positive_float, default=DEFAULT_BUDGET_GIB, help="GPU memory (> 0)")
    p.add_argument("--prompt", type=positive_int, default=PROMPT, help="prompt tokens (>= 1)")
    p.add_argument(
        "--measured",
        metavar="BENCH_JSON",
        help="a Fig. 6 GPU run: its measured workspace and peaks replace the estimate at the points it measured",
    )
    return p


def refuse(p: argparse.ArgumentParser, lines: Sequence[str]) -> None:
    """Exit 2 as argparse does, with one error line per problem."""
    p.print_usage(sys.stderr)
    p.exit(2, "".join(f"{p.prog}: error: {line}\n" for line in lines))


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    arch = ARCHITECTURES[args.model]
    kw = {"budget_gib": args.budget_gib, "prompt": args.prompt}
    measured = None
    if args.measured is not None:
        try:  # read and checked before any table is printed
            measured = read_measured(args.measured)
        except ValueError as err:
            refuse(p, str(err).splitlines())
    if measured is not None:
        print(f"\nMeasured workspace ({len(measured)} points of {args.measured}) against the estimate:\n")
        rows = [
            {
                "method": m,
                "batch": b,
                "generation": g,
                "measured GiB": w.bytes / GIB,
                "estimate GiB": point(arch, m, b, g, **kw).workspace.bytes / GIB,
                "source": w.source,
            }
            for (m, b, g), w in sorted(measured.items())
        ]
        print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".2f") if rows else "(no measured points)")
    print(
        f"{arch.name}: {arch.parameters() / 1e9:.2f} B parameters, weights {arch.weight_bytes() / GIB:.2f} GiB "
        f"(bf16); budget {args.budget_gib} GiB; P = {args.prompt}; workspace: {workspace_estimate(arch, 1, 1).source}"
    )
    print(f"\nFig. 6a: peak GiB vs generation length at B = {FIG6A_BATCH} (OOM: over budget)\n")
    print(_table(fig6a(arch, **kw), "generation", NAMES))
    print(f"\nFig. 6b: peak GiB vs batch at L_gen = {FIG6B_GENERATION}\n")
    print(_table(fig6b(arch, **kw), "batch", NAMES))
    print("\nMax batch at L_gen = 8K:")
    for m in NAMES:
        best = max_batch(arch, m, FIG6B_GENERATION, **kw)
        print(f"  {m}: " + (f"B = {best.batch} ({best.peak_gib:.2f} GiB)" if best else "B = 1 does not fit"))
    print(f"\nAgainst the paper ({GPU}, quoted):\n")
    print(tabulate(comparison(arch, **kw), headers="keys", tablefmt="github", floatfmt=".2f"))
    print()
    for note in explain(arch, **kw):
        print("- " + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
