"""GPU-readiness gate without a GPU: compile every kernel the package launches for sm_80 and sm_90.

    python -m pnmix.aot [--all | --default] [--json FILE] [--jobs N] [--require-targets] [--plain-unpack]

The launches are the package's own: `PNMixCache` prefill, append (with a page flush), decode
attention and dequantize run on CPU tensors while `pnmix._runtime.recording` keeps each launch
(grid, arguments, block sizes, warps, stages, chosen for that target) instead of running it.
Each distinct launch is specialized as Triton's JIT would on a GPU and compiled to a cubin with
the ptxas that ships in the triton wheel. Per kernel: registers, local memory (spills), shared
memory against the target's per-block maximum, warps, stages. For the decode kernel, per GPU of
`pnmix.gpus`, static upper bounds on the fraction of HBM bandwidth it can reach, and which binds
(the lowest): the issue bound (bytes of cache per tile / warp-instructions per tile x chip issue
rate / HBM bandwidth), the pipe bound (the same for the main loop's instructions of each execution
pipe at its own rate, `pnmix.gpus.PIPES`: the lowest pipe is printed with its name) and the memory
bound (programs per SM, from the compiled registers, shared memory and warps, x stages x bytes per
tile in flight, against DRAM latency x bandwidth per SM: Little's law); then the targets at the
default configuration, each PASS or FAIL.

The decode kernels are compiled as a GPU runs them by default, with the PTX unpack of their value codes
(`pnmix.kernels.ptx_unpack`; --plain-unpack: the plain unpack, the path a device takes when the PTX's self-test
fails), and each kernel's TTGIR is checked for four elements of one shift per packed inline-asm call
(`pnmix.kernels.ttgir`): a kernel that may mix shifts fails, as does a default decode kernel without inline asm.

Exit status 1 when a kernel does not compile, exceeds shared memory, spills or may mix shifts in a PTX call (and, with
--require-targets, when a target is not met); 2 on bad arguments; 3 when the toolchain (ptxas,
cuobjdump, nvdisasm) is absent. --default compiles the default configuration (both dtypes, GQA 4
and 8), --all every method x dtype x head_dim (the default); the wall times measured on 2 cores
are in docs/gpu-gate.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import torch

from pnmix import _runtime, calibration, perfmodel, sass
from pnmix.cache import PNMixCache
from pnmix.gpus import (
    ARCHS,
    GPUS,
    PIPES,
    REQUIRED_BF16_RATIO,
    REQUIRED_MEMORY_BOUND,
    REQUIRED_PATH_SPEEDUPS,
    REQUIRED_SPEEDUP,
    issue_bound,
    memory_bound,
    pipe_bound,
    pipe_counts,
    programs_per_sm,
    smem_limit,
)
from pnmix.kernels import fragment, fragment_check, fragment_decode, ptx_unpack, ttgir
from pnmix.sass import toolchain
from pnmix.token_cache import TritonTokenPrecisionCache
from reference.channels.layout import CacheLayout
from reference.methods import METHODS, TOKEN_METHODS
from reference.records import KIND, environment, write_json

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
HEAD_DIMS = (64, 128, 256)
GQA = (4, 8)
DEFAULT_METHOD = "PN-Mix"
DECODE_KERNEL = "_split_kernel"
MERGE_KERNEL = "_merge_kernel"
#: Per-token precision methods (`reference.methods.TOKEN_METHODS`, their own decode kernel) are in --all too.
#: 32-bit registers of one SM (sm_80, sm_90): a block whose threads need more cannot launch.
REGISTER_FILE = 65536


@dataclass(frozen=True)
class Case:
    """One configuration the package may run: method, dtype, head_dim, query heads per KV head."""

    method: str
    dtype: str
    head_dim: int
    gqa: int

    @property
    def default(self) -> bool:
        """The configuration the ceiling requirement is about (H3(50%)L1, G=N=128, d=128)."""
        return self.method == DEFAULT_METHOD and self.head_dim == 128


def cases(scope: str) -> list[Case]:
    methods = [*METHODS, *TOKEN_METHODS] if scope == "all" else [DEFAULT_METHOD]
    dims = HEAD_DIMS if scope == "all" else (128,)
    return [Case(m, t, d, g) for m in methods for t in DTYPES for d in dims for g in GQA]


def record_launches(case: Case, gpu: _runtime.Target) -> tuple[list[_runtime.Launch], CacheLayout | None]:
    """Every launch of a prefill (with page flushes), a one-token append, decode and dequantize (a per-token
    precision method: its decode, of a prompt with every kind of store; no layout)."""
    dtype, d, kv = DTYPES[case.dtype], case.head_dim, 2
    if case.method in TOKEN_METHODS:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, 200, d, generator=gen).to(dtype) for heads in (kv * case.gqa, kv, kv))
        bits = torch.where(torch.rand(200, generator=gen) < 0.7, 2, 4)
        with _runtime.recording(gpu) as launches:
            cache = TritonTokenPrecisionCache(TOKEN_METHODS[case.method])
            cache.prefill(q, k, v, bits)
            cache.attend(q[:, :, -1:])
        return launches, None
    config = METHODS[case.method]()
    prompt = min(config.n_sink, 64) + 2 * config.residual_length + 3
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, kv * case.gqa, prompt, d, generator=gen).to(dtype)
    k = torch.randn(1, kv, prompt, d, generator=gen).to(dtype)
    v = torch.randn(1, kv, prompt, d, generator=gen).to(dtype)
    with _runtime.recording(gpu) as launches:
        cache = PNMixCache(config, max_cache_len=32768)
        cache.prefill(q, k, v)
        cache.append(k[:, :, -1:], v[:, :, -1:])
        cache.attend(q[:, :, -1:])
        cache.dequantize()
    return launches, cache.cache_layout


def _compile(launch: _runtime.Launch, arch: int):
    """The launch specialized as the JIT does on a device of this arch, compiled to a cubin (a Gluon kernel from its
    Gluon source)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kernel = launch.kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(launch.constexprs, num_warps=launch.num_warps, num_stages=launch.num_stages, debug=False)
    if launch.maxnreg is not None:
        kwargs["maxnreg"] = launch.maxnreg
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    source = GluonASTSource if getattr(kernel, "is_gluon", lambda: False)() else ASTSource
    return triton.compile(source(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _key(launch: _runtime.Launch, arch: int) -> str:
    """What makes two launches the same compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", arch, 32))
    binder = create_function_from_signature(launch.kernel.signature, launch.kernel.params, backend)
    kwargs = dict(launch.constexprs, num_warps=launch.num_warps, num_stages=launch.num_stages)
    if launch.maxnreg is not None:
        kwargs["maxnreg"] = launch.maxnreg
    _, specialization, options = binder(*launch.args, **kwargs)
    return f"{arch}:{launch.name}:{specialization}:{sorted(options.items())}"


_INSTRUCTION, _LABEL = sass.INSTRUCTION, sass.LABEL


def kernel_digests(case: Case, target: _runtime.Target, names=None, ptx: bool = True) -> dict[str, list[str]]:
    """The SASS digest (`pnmix.sass.digest`) of every distinct kernel the package launches for `case` on `target`
    (`record_launches`), by kernel name, a name's digests sorted (one kernel may compile to several); only the
    kernels `names` lists when given. Compiled here for the target, no GPU needed; under the interpreter in a
    compiled subprocess (the kernels of this process were decorated for the interpreter)."""
    if _runtime.INTERPRETED:
        spec = json.dumps({**asdict(case), "arch": target.arch, "sms": target.sms, "names": names, "ptx": ptx})
        env = dict(os.environ, TRITON_INTERPRET="0")
        done = subprocess.run(
            [sys.executable, "-m", "pnmix.aot", "--digests", spec], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"python -m pnmix.aot --digests failed: {done.stderr.strip().splitlines()[-1:]}")
        return json.loads(done.stdout)
    with ptx_unpack.request(ptx):
        launches, _ = record_launches(case, target)
    found: dict[str, dict[str, str]] = {}
    for launch in launches:
        if names is not None and launch.name not in names:
            continue
        key = _key(launch, target.arch)
        if key not in found.setdefault(launch.name, {}):
            found[launch.name][key] = sass.digest_of(_compile(launch, target.arch))
    return {name: sorted(set(by_key.values())) for name, by_key in sorted(found.items())}


def _digests_main(spec: str) -> int:
    """--digests: `kernel_digests` of a JSON spec (Case's fields, arch, sms, names, ptx), printed as JSON."""
    given = json.loads(spec)
    case = Case(given["method"], given["dtype"], int(given["head_dim"]), int(given["gqa"]))
    target = _runtime.Target(int(given["arch"]), int(given["sms"]))
    print(json.dumps(kernel_digests(case, target, given.get("names"), bool(given.get("ptx")))))
    return 0


_BRANCH = sass.BRANCH


def main_loop_body(sass: str) -> list[str] | None:
    """SASS instructions of the largest loop body (a label up to the branch back to it), in order."""
    labels, body = {}, []
    for line in sass.splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(body)
        elif m := _INSTRUCTION.match(line):
            body.append(m.group(2))
    loops = []
    for i, ins in enumerate(body):
        if (m := _BRANCH.search(ins)) and m.group(1) in labels and labels[m.group(1)] < i:  # not the exit trap
            loops.append((i + 1 - labels[m.group(1)], labels[m.group(1)], i + 1))
    if not loops:
        return None
    _, first, end = max(loops)
    return body[first:end]


def main_loop_instructions(sass: str) -> int | None:
    """SASS instructions of the largest loop body (a label up to the branch back to it)."""
    body = main_loop_body(sass)
    return len(body) if body is not None else None


_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


def opcodes(instructions: list[str]) -> dict[str, int]:
    """How many of each opcode (without predicate and modifiers: "IMAD" for "@P0 IMAD.MOV.U32 R1, RZ, RZ, R2")."""
    counts: dict[str, int] = {}
    for ins in instructions:
        op = _PREDICATE.sub("", ins.strip()).split(" ", 1)[0].split(".", 1)[0]
        counts[op] = counts.get(op, 0) + 1
    return counts


_JOBS: list[tuple[str, _runtime.Launch, int]] = []  # filled before the workers fork: kernels do not pickle


def _inspect(index: int) -> dict:
    """Compile one launch and read its resources and SASS (runs in a worker process)."""
    key, launch, arch = _JOBS[index]
    row = {"key": key, "kernel": launch.name, "arch": arch, "warps": launch.num_warps, "stages": launch.num_stages}
    try:
        compiled = _compile(launch, arch)
    except Exception as exc:
        return row | {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    registers, local_bytes = sass.registers_and_local_bytes(compiled.asm["cubin"])
    listing = sass.disassemble(compiled.asm["cubin"])
    return row | {
        "inline_asm": len(ttgir.inline_asm_ops(compiled.asm["ttgir"])),
        "grouping": ttgir.grouping_problems(compiled.asm["ttgir"]),
        "registers": registers,
        "local_bytes": local_bytes,
        "shared_bytes": int(compiled.metadata.shared),
        "smem_limit": smem_limit(arch),
        "instructions": sum(1 for line in listing.splitlines() if _INSTRUCTION.match(line)),
        "loop_instructions": len(body) if (body := main_loop_body(listing)) is not None else None,
        "loop_opcodes": opcodes(body) if body is not None else None,
        # the listing with control codes, for the performance model (pnmix.perfmodel)
        "encoded": sass.disassemble(compiled.asm["cubin"], encoding=True)
        if launch.name in (DECODE_KERNEL, MERGE_KERNEL)
        else None,
        "constexprs": {k: v for k, v in launch.constexprs.items() if isinstance(v, (int, bool))},
    }


def tile_bytes(layout: CacheLayout, block_n: int) -> float:
    """Bytes of one KV head's quantized region that a tile of block_n tokens reads."""
    per_page = sum(c.rows_per_page * c.columns * c.dtype.itemsize for c in layout.components if c.region == "quantized")
    return per_page / layout.config.residual_length * block_n


def problems(row: dict) -> list[str]:
    if "error" in row:
        return [f"does not compile: {row['error']}"]
    found = []
    if row["shared_bytes"] > row["smem_limit"]:
        found.append(f"shared memory {row['shared_bytes']} B > {row['smem_limit']} B per block")
    if row["local_bytes"] > 0:
        found.append(f"{row['local_bytes']} B of local memory per thread (spills)")
    found += [f"PTX unpack: {p}" for p in row.get("grouping", [])]
    threads = row["warps"] * 32
    if row["registers"] * threads > REGISTER_FILE:
        found.append(f"{row['registers']} registers x {threads} threads > the {REGISTER_FILE} of an SM (cannot launch)")
    return found


def run(scope: str, jobs: int, ptx: bool = True, predictions: bool = True) -> dict:
    """Record, compile and judge every launch of `scope` (ptx: with the PTX unpack, the default; False: the plain
    unpack, its fallback); the result as a
    JSON-ready dict."""
    import tqdm

    unique, uses = {}, []
    for case in cases(scope):
        for gpu in {g.arch: g for g in GPUS}.values():
            with ptx_unpack.request(ptx):  # the flag alone decides, whatever the environment says
                launches, layout = record_launches(case, _runtime.Target(gpu.arch, gpu.sms))
            merge = next((_key(x, gpu.arch) for x in launches if x.name == MERGE_KERNEL), None)
            for launch in launches:
                key = _key(launch, gpu.arch)
                unique.setdefault(key, (key, launch, gpu.arch))
                if launch.name == DECODE_KERNEL:
                    block_n = launch.constexprs["BLOCK_N"]
                    storage = perfmodel.Storage(
                        layout.config.n_sink,
                        layout.config.residual_length,
                        layout.config.group_size,
                        tile_bytes(layout, block_n) / block_n,
                    )
                    uses.append((case, gpu.arch, key, tile_bytes(layout, block_n), merge, storage))
    rows = {}
    _JOBS[:] = unique.values()
    with ProcessPoolExecutor(max(1, jobs), mp_context=get_context("fork")) as pool:
        progress = tqdm.tqdm(total=len(unique), desc="compiling", unit="kernel", file=sys.stderr)
        for row in pool.map(_inspect, range(len(_JOBS))):
            rows[row["key"]] = row
            progress.update()
        progress.close()
    decode, model_cache = [], {}
    design_inputs = {}  # arch -> the default configuration's merge kernel and storage (float16), for `design`
    for case, arch, key, nbytes, merge, storage in uses:
        if case.default and case.dtype == "float16" and merge is not None:
            design_inputs.setdefault(arch, (rows[merge], storage))
        entry = decode_entry(case, arch, rows[key], nbytes)
        wanted = predictions and (scope == "default" or case.default)
        if wanted and merge is not None and "error" not in rows[key]:
            entry["predictions"] = predict(rows[key], rows[merge], storage, arch, model_cache)
        decode.append(entry)
    failures = [f"{r['kernel']} sm_{r['arch']}: {p}" for r in rows.values() for p in problems(r)]
    if ptx:
        failures += [
            f"{DECODE_KERNEL} sm_{arch} ({case.dtype}, GQA {case.gqa}): no inline asm with the PTX unpack"
            for case, arch, key, *_ in uses
            if case.default and rows[key].get("inline_asm") == 0
        ]
    designs = design(design_inputs, model_cache) if predictions and design_inputs else []
    failures += [f"fragment-order loop sm_{d['arch']} {d['dtype']}: {p}" for d in designs for p in d["problems"]]
    for row in rows.values():
        row.pop("encoded", None)  # kept out of the result: megabytes of listing
    checks = targets(decode) + path_targets(designs)
    return {
        "scope": scope,
        "ptx_unpack": ptx,
        "archs": list(ARCHS),
        "kernels": list(rows.values()),
        "decode": decode,
        "failures": failures,
        "targets": checks,
        "below_target": [c["text"] for c in checks if not c["passed"]],
        "fragment_design": designs,
    }


#: Query rows per KV head the fragment-order loop is compiled for here: the workloads' GQA (Qwen3-8B: 4).
FRAGMENT_ROWS = 4


def compile_fragment_loop(arch: int, use_ptx: bool = True, dtype: torch.dtype = torch.float16, merges: bool = True):
    """The fragment-order loop (`pnmix.kernels.fragment_decode`) compiled ahead of time for sm_`arch` (no GPU needed:
    triton's ptxas) exactly as `fragment_check.launch` launches it (its launches recorded, then the one that merges
    its splits itself, or the one that leaves them to the merge kernel, compiled as the JIT would on such a device),
    as `triton.compile` returns it."""
    if _runtime.INTERPRETED:
        raise RuntimeError(
            "compile_fragment_loop needs compiled kernels (triton's own jit functions are interpreted here): run "
            "with TRITON_INTERPRET=0, as `python -m pnmix.aot` does"
        )
    # specialized as a long context is: tiles and groups multiples of 16, splits neither 1 nor a multiple of 16
    args, _ = fragment_check.synthetic(tiles=32, seed=0, rows=FRAGMENT_ROWS, sinks=32, residual=100, dtype=dtype)
    gpu = next(g for g in GPUS if g.arch == arch)
    with _runtime.recording(_runtime.Target(arch, gpu.sms)) as launches:
        fragment_check.launch(args, 1.0, 3, use_ptx)
    (launch,) = [x for x in launches if bool(x.constexprs["FUSED"]) == merges]
    return _compile(launch, arch)


def _design_loop(
    arch: int, use_ptx: bool, dtype: str = "float16", merges: bool = True
) -> tuple[dict, perfmodel.Kernel, list]:
    """The fragment-order loop compiled for sm_`arch` and queries of `dtype`, merging its splits itself or not: its
    resources, its model kernel and its loop's instructions."""
    res = fragment_decode.resources(compile_fragment_loop(arch, use_ptx=use_ptx, dtype=DTYPES[dtype], merges=merges))
    kernel = perfmodel.Kernel.of(
        res["encoded"],
        res["registers"],
        res["shared_bytes"],
        fragment.WARPS,
        {"BLOCK_N": fragment_decode.TOKENS_PER_ITERATION},
    )
    loop = kernel.code.main
    return res, kernel, kernel.code.instructions[loop.start : loop.end] if loop else []


#: The fragment-order loop's two launched forms: merging its splits itself (batch 1) or not (large batches).
LOOP_FORMS = {True: "merging in the loop", False: "with the merge kernel"}


def _predicted_step(kernels: dict, merge: perfmodel.Kernel, storage, w, gpu, cache: dict) -> dict:
    """The decode step of the form the package launches at `w` on `gpu` (`perfmodel.merges_in_loop`)."""
    items = w.batch * w.kv_heads
    splits = perfmodel.default_splits(gpu, items, w.context, fragment_decode.TOKENS_PER_ITERATION)
    programs = perfmodel.split_plan(splits, items, 2 * gpu.sms)[2]
    merges = perfmodel.merges_in_loop(items, programs, 2 * gpu.sms)
    step = perfmodel.decode_step(
        kernels[merges],
        None if merges else merge,
        storage,
        w,
        gpu,
        cache,
        exact_last=fragment.TILE,
        merge_chunk=fragment_decode.merge_chunk(w.gqa) if merges else None,
    )
    return step | {"form": LOOP_FORMS[merges]}


def design(inputs: dict[int, tuple[dict, perfmodel.Storage]], cache: dict) -> list[dict]:
    """The fragment-order path (`pnmix.kernels.fragment_attention`: what a `PNMixCache` of the default configuration
    runs in float16 or bfloat16 where the loop passed its first-use self-test) on each arch and dtype: the loop's
    resources in each form (merging its splits itself or not, with the inline-PTX unpack and without), the
    shared-memory stores of its loop (none: no code passes through shared memory after its copy), and the predicted
    decode step at every workload per GPU in the form the package launches there (`_predicted_step`)."""
    out = []
    for (arch, (merge_row, storage)), dtype in itertools.product(sorted(inputs.items()), ("float16", "bfloat16")):
        entry = {"arch": arch, "dtype": dtype}
        compiled = {}
        try:
            for use_ptx, merges in itertools.product((True, False), (True, False)):
                compiled[use_ptx, merges] = _design_loop(arch, use_ptx, dtype, merges)
        except Exception as exc:  # a failure to compile is a finding of the gate, not a crash of it
            out.append(entry | {"problems": [f"does not compile: {type(exc).__name__}: {str(exc).splitlines()[-1]}"]})
            continue
        problems, forms = [], {}
        for (use_ptx, merges), (res, _, body) in compiled.items():
            name = ("" if use_ptx else "plain unpack, ") + LOOP_FORMS[merges]
            stores = sum(1 for i in body if i.base in ("STS", "STSM"))
            if res["local_bytes"]:
                problems.append(f"{name}: {res['local_bytes']} B of local memory per thread (spills)")
            if stores:
                problems.append(f"{name}: {stores} shared-memory stores in its loop")
            forms[name] = {
                "registers": res["registers"],
                "local_bytes": res["local_bytes"],
                "shared_bytes": res["shared_bytes"],
                "loop_instructions": len(body),
                "loop_shared_stores": stores,
            }
        if merge_row["key"] not in cache:
            cache[merge_row["key"]] = model_kernel(merge_row)
        kernels = {merges: compiled[True, merges][1] for merges in (True, False)}
        worst = max(forms.values(), key=lambda f: (f["local_bytes"], f["registers"]))
        entry |= {
            **{k: worst[k] for k in ("registers", "local_bytes", "shared_bytes")},
            "loop_instructions": forms[LOOP_FORMS[False]]["loop_instructions"],
            "loop_shared_stores": max(f["loop_shared_stores"] for f in forms.values()),
            "stages": fragment_decode.STAGES,
            "forms": forms,
            "problems": problems,
            "predictions": {
                gpu.name: [
                    _predicted_step(kernels, cache[merge_row["key"]], storage, w, gpu, cache)
                    for w in perfmodel.WORKLOADS
                ]
                for gpu in GPUS
                if gpu.arch == arch
            },
        }
        out.append(entry)
    return out


def calibrate() -> list[dict]:
    """Each point of `pnmix.calibration`: the model's prediction beside what the GPU measured (or why it could not
    be made here)."""
    out = []
    for point in calibration.POINTS:
        try:
            out.append(calibration.check(point))
        except calibration.Unavailable as exc:
            out.append({"label": point.label, "error": str(exc)})
    return out


def model_kernel(row: dict) -> perfmodel.Kernel:
    """A compiled row (`_inspect`) as the performance model's kernel."""
    return perfmodel.Kernel.of(row["encoded"], row["registers"], row["shared_bytes"], row["warps"], row["constexprs"])


def predict(split: dict, merge: dict, storage: perfmodel.Storage, arch: int, cache: dict) -> dict[str, list[dict]]:
    """The predicted decode step (`pnmix.perfmodel.decode_step`) at every workload of `perfmodel.WORKLOADS`, per GPU
    of this arch (`cache` keeps the kernels and simulations that several entries share)."""
    for row in (split, merge):
        if row["key"] not in cache:
            cache[row["key"]] = model_kernel(row)
    kernels = (cache[split["key"]], cache[merge["key"]])
    return {
        gpu.name: [perfmodel.decode_step(*kernels, storage, w, gpu, cache) for w in perfmodel.WORKLOADS]
        for gpu in GPUS
        if gpu.arch == arch
    }


def decode_entry(case: Case, arch: int, row: dict, nbytes: float) -> dict:
    """The decode kernel of one configuration on one arch: both bounds for each GPU of that arch.

    bounds[gpu]: issue (None when the main loop was not found), pipe (the lowest bound of the pipes of
    `pnmix.gpus.PIPES`, each at its own rate; None without the loop's opcodes) and pipe_name (which pipe), memory,
    ceiling (the lowest of the three) and binds (which one is lowest: "issue", the pipe's name, or "memory").
    pipes: the loop's warp-instructions per tile on each pipe."""
    entry = asdict(case) | {"arch": arch, "tile_bytes": nbytes, "warps": row["warps"], "stages": row["stages"]}
    if "error" in row:
        return entry
    entry["inline_asm"] = row.get("inline_asm", 0)
    programs = programs_per_sm(arch, row["registers"], row["warps"], row["shared_bytes"])
    entry |= {
        "registers": row["registers"],
        "shared_bytes": row["shared_bytes"],
        "programs_per_sm": programs,
        "in_flight_per_sm": programs * row["stages"] * nbytes,
    }
    per_tile = row["loop_instructions"] * row["warps"] if row.get("loop_instructions") else None
    entry["warp_instructions_per_tile"] = per_tile
    ops = row.get("loop_opcodes")
    pipes = {name: n * row["warps"] for name, n in pipe_counts(ops).items()} if ops and per_tile else None
    entry["pipes"] = pipes
    entry["bounds"] = {}
    for gpu in (g for g in GPUS if g.arch == arch):
        memory = memory_bound(gpu, programs, row["stages"], nbytes)
        issue = issue_bound(gpu, nbytes, per_tile) if per_tile else None
        by_pipe = {p.name: pipe_bound(gpu, nbytes, pipes[p.name], p) for p in PIPES if pipes and p.name in pipes}
        pipe_name = min(by_pipe, key=by_pipe.get) if by_pipe else None
        candidates = {"memory": memory}
        if issue is not None:
            candidates["issue"] = issue
        if pipe_name is not None:
            candidates[pipe_name] = by_pipe[pipe_name]
        binds = min(candidates, key=candidates.get)
        entry["bounds"][gpu.name] = {
            "issue": None if issue is None else round(issue, 4),
            "pipe": None if pipe_name is None else round(by_pipe[pipe_name], 4),
            "pipe_name": pipe_name,
            "memory": round(memory, 4),
            "ceiling": round(candidates[binds], 4),
            "binds": binds,
            "needed_in_flight_per_sm": round(gpu.bytes_in_flight_per_sm),
        }
    return entry


def targets(decode: list[dict]) -> list[dict]:
    """The targets on each default-configuration decode entry (dtype x GQA): the memory bound on every GPU of its
    arch, and the predicted speed-up over FP16 SDPA at `REQUIRED_SPEEDUP`'s GPU and workload."""
    checks = []
    for e in decode:
        if not Case(e["method"], e["dtype"], e["head_dim"], e["gqa"]).default:
            continue
        where = f"({e['dtype']}, GQA {e['gqa']})"
        for gpu in (g for g in GPUS if g.arch == e["arch"]):
            got = e.get("bounds", {}).get(gpu.name, {}).get("memory")
            passed = got is not None and got >= REQUIRED_MEMORY_BOUND
            shown = "not computed" if got is None else f"{got:.0%}"
            sign = ">=" if passed else "<"
            checks.append(
                {
                    "gpu": gpu.name,
                    "dtype": e["dtype"],
                    "gqa": e["gqa"],
                    "bound": "memory",
                    "need": REQUIRED_MEMORY_BOUND,
                    "got": got,
                    "passed": passed,
                    "text": f"memory bound {shown} {sign} {REQUIRED_MEMORY_BOUND:.0%} on {gpu.name} {where}",
                }
            )
            if gpu.name != REQUIRED_SPEEDUP["gpu"]:
                continue
            found = [
                p for p in e.get("predictions", {}).get(gpu.name, []) if p["workload"] == REQUIRED_SPEEDUP["workload"]
            ]
            got = found[0]["speedup_vs_fp16"] if found else None
            need = REQUIRED_SPEEDUP["speedup"]
            passed = got is not None and got >= need
            shown = "not predicted" if got is None else f"{got:.2f}x"
            checks.append(
                {
                    "gpu": gpu.name,
                    "dtype": e["dtype"],
                    "gqa": e["gqa"],
                    "bound": "speedup",
                    "need": need,
                    "got": got,
                    "passed": passed,
                    "text": f"predicted speed-up of the Triton kernel (the fallback) over FP16 SDPA {shown} "
                    f"{'>=' if passed else '<'} {need:.1f}x on {gpu.name}, {REQUIRED_SPEEDUP['workload']} {where}",
                }
            )
    return checks


def path_targets(designs: list[dict]) -> list[dict]:
    """The fragment-order path's predicted speed-ups over FP16 SDPA against `REQUIRED_PATH_SPEEDUPS` on
    `REQUIRED_SPEEDUP`'s GPU (float16, the default configuration, GQA 4)."""
    gpu = REQUIRED_SPEEDUP["gpu"]
    checks = []
    times = {(d["dtype"], p["workload"]): p["time_us"] for d in designs for p in d.get("predictions", {}).get(gpu, [])}
    for workload in REQUIRED_PATH_SPEEDUPS:
        fp16, bf16 = times.get(("float16", workload)), times.get(("bfloat16", workload))
        if fp16 is None or bf16 is None:
            continue
        ratio = bf16 / fp16
        passed = ratio <= REQUIRED_BF16_RATIO
        checks.append(
            {
                "gpu": gpu,
                "dtype": "bfloat16",
                "gqa": 4,
                "bound": "path bfloat16",
                "workload": workload,
                "need": REQUIRED_BF16_RATIO,
                "got": round(ratio, 4),
                "passed": passed,
                "text": f"predicted time of the fragment-order path in bfloat16 {ratio:.2f}x float16's "
                f"{'<=' if passed else '>'} {REQUIRED_BF16_RATIO:.2f}x on {gpu}, {workload} (GQA 4)",
            }
        )
    for d in designs:
        found = {p["workload"]: p for p in d.get("predictions", {}).get(gpu, [])}
        if not found or d["dtype"] != "float16":
            continue
        for workload, need in REQUIRED_PATH_SPEEDUPS.items():
            got = found[workload]["speedup_vs_fp16"] if workload in found else None
            passed = got is not None and got >= need
            shown = "not predicted" if got is None else f"{got:.2f}x"
            checks.append(
                {
                    "gpu": gpu,
                    "dtype": "float16",
                    "gqa": 4,
                    "bound": "path speedup",
                    "workload": workload,
                    "need": need,
                    "got": got,
                    "passed": passed,
                    "text": f"predicted speed-up of the fragment-order path over FP16 SDPA {shown} "
                    f"{'>=' if passed else '<'} {need:.1f}x on {gpu}, {workload} (float16, GQA 4)",
                }
            )
    return checks


#: What the two bounds assume, printed under their table.
ASSUMPTIONS = """\
Both bounds are upper bounds on the fraction of HBM bandwidth (datasheet), not predictions.
issue: one warp-instruction per clock per scheduler (4 per SM) at boost clock, every cycle (enough
  warps resident and ready), the main loop's SASS count per tile, nothing else in the kernel.
pipe: the same for the loop's instructions of each pipe at that pipe's rate per SM (pnmix.gpus.PIPES:
  fma = fp32 + IMAD, 2 warp-instr/clock on sm_80, 4 on sm_90; imad 2; alu (integer, bit, compare,
  select, move) 2; xu (conversions, MUFU) 0.5; shfl 1); the lowest pipe is printed with its name.
memory: programs/SM from the compiled registers (allocated per warp in units of 256), shared
  memory (+1 KB per block), warps and block slots, as the occupancy calculator; the grid fills
  every SM that much; every load of a tile issued before the first is used, `stages` tiles of
  unique bytes in flight per program; an idle DRAM latency (pnmix.gpus.LATENCY_SOURCE: a loaded
  memory system answers later, so the real need is larger); bytes/tile counts the quantized
  region's unique bytes (repeat requests that hit L1 are free)."""


def render(result: dict) -> str:
    from tabulate import tabulate

    kernels = sorted(result["kernels"], key=lambda r: (r["kernel"], r["arch"], r.get("shared_bytes", 0)))
    head = ["kernel", "arch", "warps", "stages", "regs", "local B", "shared B", "limit B", "SASS", "loop SASS"]
    table = [
        [
            r["kernel"],
            f"sm_{r['arch']}",
            r["warps"],
            r["stages"],
            r.get("registers", "-"),
            r.get("local_bytes", "-"),
            r.get("shared_bytes", "-"),
            r["smem_limit"] if "smem_limit" in r else "-",
            r.get("instructions", "-"),
            r.get("loop_instructions") or "-",
        ]
        for r in kernels
    ]
    bound_head = [
        "method",
        "dtype",
        "d",
        "GQA",
        "GPU",
        "bytes/tile",
        "warp-instr/tile",
        "regs",
        "programs/SM",
        "stages",
        "in flight B/SM",
        "needed B/SM",
        "issue",
        "pipe",
        "memory",
        "binds",
        "ceiling",
    ]
    bound_rows = [
        [
            e["method"],
            e["dtype"],
            e["head_dim"],
            e["gqa"],
            gpu,
            round(e["tile_bytes"]),
            e.get("warp_instructions_per_tile") or "-",
            e.get("registers", "-"),
            e.get("programs_per_sm", "-"),
            e["stages"],
            round(e.get("in_flight_per_sm", 0)),
            b["needed_in_flight_per_sm"],
            _pct(b["issue"]),
            "-" if b.get("pipe") is None else f"{_pct(b['pipe'])} {b['pipe_name']}",
            _pct(b["memory"]),
            b["binds"],
            _pct(b["ceiling"]),
        ]
        for e in result["decode"]
        for gpu, b in e.get("bounds", {}).items()
    ]
    lines = [
        f"{len(kernels)} distinct kernels compiled for {', '.join(f'sm_{a}' for a in result['archs'])}",
        tabulate(table, head, tablefmt="github"),
        "",
        "Decode kernel: static bounds per GPU (fraction of HBM bandwidth); the lowest one binds",
        tabulate(bound_rows, bound_head, tablefmt="github"),
        ASSUMPTIONS,
        "",
    ]
    predicted = [
        [
            e["method"],
            e["dtype"],
            e["gqa"],
            gpu,
            p["workload"],
            p["splits"],
            p["programs_per_sm"],
            "+".join(f"{n}x{k}" for n, k in p["waves"]),
            f"{p['time_us']:.1f}",
            f"{p['split_us']:.1f} / {p['merge_us']:.1f} / {p['launch_us']:.1f}",
            f"{p['fraction_of_hbm']:.1%}",
            f"{p['fp16_us']:.1f}",
            f"{p['speedup_vs_fp16']:.2f}x",
            f"{p['limit']} {p['main_loop_causes'].get(p['limit'], 0):.0%}",
            e["bounds"][gpu]["binds"] + " " + _pct(e["bounds"][gpu]["ceiling"]),
        ]
        for e in result["decode"]
        for gpu, rows in e.get("predictions", {}).items()
        for p in rows
    ]
    if predicted:
        head = [
            "method",
            "dtype",
            "GQA",
            "GPU",
            "workload",
            "splits",
            "programs/SM",
            "waves x per SM",
            "us",
            "split / merge / launch us",
            "% of HBM",
            "FP16 us",
            "vs FP16",
            "lowest bound",
        ]
        lines += [
            "Decode attention of one layer: predicted (pnmix.perfmodel: the SASS simulated per scheduler, over the "
            "grid's waves, merge and launches; calibrated on the GPU measurement of pnmix.calibration)",
            tabulate(predicted, head, tablefmt="github"),
            f"FP16 SDPA at its stated rate (pnmix.gpus.FP16_DECODE_RATES); vs FP16 above 1: faster than FP16. "
            f"{perfmodel.LAUNCH_NOTE}; DRAM latency {perfmodel.LATENCY_FACTOR} x the idle one (fitted). "
            "'holds the loop': what held the warps most of the quantized loop's cycles (pnmix.perfmodel.CAUSES) "
            "and its share; 'HBM bandwidth' where the bytes bind.",
            "",
        ]
    designs = [d for d in result.get("fragment_design", []) if "predictions" in d]
    if designs:
        rows = [
            [
                f"sm_{d['arch']}",
                d["dtype"],
                d["registers"],
                d["local_bytes"],
                d["shared_bytes"],
                d["loop_instructions"],
                d["loop_shared_stores"],
                gpu,
                p["workload"],
                p["programs_per_sm"],
                f"{p['time_us']:.1f}",
                f"{p['fraction_of_hbm']:.1%}",
                f"{p['fp16_us']:.1f}",
                f"{p['speedup_vs_fp16']:.2f}x",
                f"{p['limit']} {p['main_loop_causes'].get(p['limit'], 0):.0%}",
            ]
            for d in designs
            for gpu, ps in d["predictions"].items()
            for p in ps
        ]
        head = [
            "arch",
            "dtype",
            "regs",
            "local B",
            "shared B",
            "loop SASS",
            "loop STS",
            "GPU",
            "workload",
            "programs/SM",
            "us",
            "% of HBM",
            "FP16 us",
            "vs FP16",
            "holds the loop",
        ]
        lines += [
            "Fragment-order path (pnmix.kernels.fragment_attention: what PNMixCache runs in float16 at the default "
            "configuration where the loop passed its first-use self-test; the kernel rows above are its fallback): "
            "the fragment-order loop (codes in MMA-fragment order, 16 tokens per warp, "
            f"{fragment_decode.STAGES}-stage cp.async ring, float32-grade operands, headroom exponents; its last "
            "split reads the exact regions first; the last program of a head merges its splits, one launch): "
            "predicted",
            tabulate(rows, head, tablefmt="github"),
            "",
        ]
    for c in result.get("calibration", []):
        if "error" in c:
            lines.append(f"calibration: unavailable: {c['error']}")
        else:
            lines.append(
                f"calibration: {c['label']} ({c['commit']}) on {c['gpu']}, {c['workload']}: predicted "
                f"{c['predicted_us']:.1f} us, measured {c['measured_us']:.1f} us ({c['ratio']:.2f}x; "
                f"{'within' if c['holds'] else 'OUTSIDE'} {calibration.TOLERANCE}x)"
            )
    if result.get("ptx_unpack"):
        asm = sorted({(e["dtype"], e["arch"], e.get("inline_asm", 0)) for e in result["decode"]})
        lines.append(
            "PTX unpack (the default; --plain-unpack: without it): decode kernels' packed inline-asm ops "
            + ", ".join(f"{dtype} sm_{arch}: {n}" for dtype, arch, n in asm)
            + "; each checked for four elements of one shift per call"
        )
    lines += [f"FAIL {f}" for f in result["failures"]] or ["PASS: every kernel compiles, fits and does not spill"]
    if result["targets"]:
        lines += [
            "",
            f"Targets at the default configuration: memory bound >= {REQUIRED_MEMORY_BOUND:.0%} on every GPU "
            f"(of datasheet bandwidth, at least the copy bandwidth), predicted speed-up over FP16 SDPA >= "
            f"{REQUIRED_SPEEDUP['speedup']}x on {REQUIRED_SPEEDUP['gpu']} at {REQUIRED_SPEEDUP['workload']}; the "
            "fragment-order path's at "
            + ", ".join(f"{w} >= {x}x" for w, x in REQUIRED_PATH_SPEEDUPS.items())
            + f" on the same GPU, its bfloat16 time within {REQUIRED_BF16_RATIO}x of float16's there",
        ]
        lines += [f"{'PASS' if c['passed'] else 'FAIL'} target: {c['text']}" for c in result["targets"]]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m pnmix.aot", description=__doc__.split("\n\n")[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--all", dest="scope", action="store_const", const="all", help="every method x dtype x d x GQA")
    scope.add_argument(
        "--default",
        dest="scope",
        action="store_const",
        const="default",
        help="the default configuration only (d=128), both dtypes and GQA 4/8",
    )
    parser.add_argument("--json", type=Path, help="also write the result as JSON (atomically)")
    parser.add_argument(
        "--require-targets",
        "--require-ceiling",
        dest="require_targets",
        action="store_true",
        help="exit 1 when a target of the default configuration is not met",
    )
    parser.add_argument("--jobs", type=_positive, default=os.cpu_count() or 1, help="parallel compiles")
    parser.add_argument(
        "--plain-unpack",
        action="store_true",
        help="decode kernels with the plain unpack of their value codes, not the PTX one (pnmix.kernels.ptx_unpack): "
        "the path a GPU takes where the PTX's self-test fails",
    )
    parser.add_argument(
        "--bounds-only",
        action="store_true",
        help="the bounds without the predictions (pnmix.perfmodel) and without the calibration",
    )
    parser.add_argument(
        "--no-calibration",
        action="store_true",
        help="leave out the calibration points (pnmix.calibration: kernels a GPU timed, compiled from git history)",
    )
    parser.add_argument("--digests", metavar="SPEC", help=argparse.SUPPRESS)  # kernel_digests' subprocess
    args = parser.parse_args(argv)
    if args.json is not None and not os.access(args.json.parent if str(args.json.parent) else ".", os.W_OK):
        parser.error(f"--json: cannot write into {args.json.parent}")
    tools = toolchain()
    if isinstance(tools, str):
        print(f"pnmix.aot: skipped: {tools}", file=sys.stderr)
        return 3
    if _runtime.INTERPRETED:  # kernels were decorated for the interpreter: start again compiled
        env = dict(os.environ, TRITON_INTERPRET="0")
        return subprocess.run([sys.executable, "-m", "pnmix.aot", *argv], env=env).returncode
    if args.digests is not None:
        return _digests_main(args.digests)
    result = run(args.scope or "all", args.jobs, not args.plain_unpack, not args.bounds_only)
    if not (args.no_calibration or args.bounds_only):
        result["calibration"] = calibrate()
    print(render(result))
    if args.json is not None:
        write_json(args.json, {KIND: "pnmix-aot", **environment(None), **result})
    return 1 if result["failures"] or (args.require_targets and result["below_target"]) else 0


if __name__ == "__main__":
    sys.exit(main())
