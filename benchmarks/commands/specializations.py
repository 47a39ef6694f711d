"""The kernel specializations a step of `python -m benchmarks.gpu_check --short` compiles, counted before it runs,
and the seconds their compilation is estimated to take.

A dry run: the step's work runs on the CPU with every Triton launch recorded instead of run
(`pnmix._runtime.recording`, as `pnmix.aot.record_launches` records them) for the session's GPU (its compute
capability and SM count; without CUDA, `DEFAULT_GPU`), and each launch is keyed as Triton's JIT keys it on that
GPU (`pnmix.aot._key`: the kernel, every argument's type and specialization, constexprs, warps, stages). The
distinct keys are the specializations the step compiles on a cold machine; `gpu_check` leaves out those an
earlier step of the same session compiled (Triton's cache keeps them).

- A pytest step (conformance, capture, separate) runs its own tests and options in this process with
  `--device cpu` and the implementations' compiled claims (TRITON_INTERPRET=0) plus the CPU: every explicit
  example and every draw of the step's hypothesis profile, as the step draws them (derandomized). The outputs
  are never computed, so each test's failures are ignored (inside hypothesis too, which would otherwise shrink
  and draw more). A test that skips in the dry run launches nothing and is counted as `skipped`, with its reason:
  one the step skips too (a property the implementation does not claim), or one that needs CUDA (CUDA graphs),
  whose kernels are then missing from the count. Tests marked `gpu` run (conftest.py skips them without CUDA).
- A benchmark step: each point's caches as its suite builds and walks them, one layer (every layer of a model
  has the same shape): the kernel point's cache filled and attended (and at each launch choice, or with the PTX
  unpack asked for and not), a Fig. 7 walk (eager, and the capturable twin a CUDA graph replays) or a Fig. 6c
  walk (the sampled protocol's fills and steps).
- Every step that decodes on a GPU also counts the PTX unpack's first-use self-test (`pnmix.kernels.unpack`'s
  probe, each probed dtype and width, by the PTX and plainly): the first such step of a session compiles it.

    python -m benchmarks.commands.specializations SPEC_JSON

runs the dry run of a spec (`{"target": [arch, sms], "steps": {name: {"pytest": [...]} | {"points": [...]}}}`)
and prints one JSON line: per step its keys, tests, skipped tests and up to three of their reasons. `count` runs
it in a subprocess with TRITON_INTERPRET=0 and CUDA hidden (recording needs compiled kernels on CPU tensors),
from any process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Seconds to compile one specialization: an estimate, from `python -m pnmix.aot --all` (336 distinct kernels
#: compiled for sm_80 and sm_90 and inspected, 359 CPU-seconds on 2 cores, triton 3.7.1, 2026-12-01,
#: docs/gpu-gate.md); Triton's JIT compiles one at a time, at the first launch of each.
SECONDS_PER_SPECIALIZATION = 359 / 336
ESTIMATE_SOURCE = "359 CPU-s / 336 kernels of `python -m pnmix.aot --all` on 2 cores (docs/gpu-gate.md)"
#: The GPU the dry run targets where there is no CUDA device (--tiny on the CPU): an H100-SXM (sm_90, 132 SMs).
DEFAULT_GPU = "H100-SXM"
#: Seconds the dry run of all steps may take before it is given up (the count is then unknown, not an error).
TIMEOUT_S = 120
#: The entry of a count: what `count` returns per step.
FIELDS = ("keys", "tests", "skipped", "skip_reasons")


def default_target() -> tuple[int, int]:
    """(compute capability, SMs) of the current CUDA device, else of `DEFAULT_GPU` (`pnmix.gpus`)."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return props.major * 10 + props.minor, props.multi_processor_count
    from pnmix.gpus import GPUS  # deferred: the pnmix package imports triton

    (gpu,) = [g for g in GPUS if g.name == DEFAULT_GPU]
    return gpu.arch, gpu.sms


def count(steps: dict[str, dict], target: tuple[int, int], cwd: Path, timeout_s: float = TIMEOUT_S) -> dict:
    """The dry run of `steps` ({name: {"pytest": args} or {"points": [point, ...]}}) for `target`, in a subprocess
    run in `cwd` (what pytest leaves behind stays there): {name: {field: ...} for FIELDS}, or {"error": why}
    when the dry run failed or ran past timeout_s."""
    spec = json.dumps({"target": list(target), "steps": steps})
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": _pythonpath()}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.commands.specializations", spec],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the dry run took more than {timeout_s:g} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the dry run exited {done.returncode}: {tail}"[:300]}
    return json.loads(lines[-1])


def _pythonpath() -> str:
    """This checkout first, so that a subprocess started elsewhere imports the same code."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])


def seconds(n: int) -> float:
    """The estimated seconds to compile n specializations."""
    return round(n * SECONDS_PER_SPECIALIZATION, 1)


# -- the dry run (in the subprocess) ------------------------------------------------------------------------


def _keys(launches, arch: int) -> set[str]:
    from pnmix import aot  # deferred: run in the dry run's child

    return {aot._key(launch, arch) for launch in launches}


def probe_keys(arch: int) -> set[str]:
    """The PTX unpack's self-test on a GPU: the probe kernel at each probed (dtype, width), by the PTX and plainly."""
    import torch
    import triton.language as tl

    from pnmix import _runtime  # deferred: run in the dry run's child
    from pnmix.kernels import unpack  # deferred: run in the dry run's child

    launches = []
    for dtype, bits in unpack.PROBED:
        out = torch.empty(unpack.PROBE_ROWS, unpack.PROBE_COLUMNS, dtype=unpack.TORCH_DTYPES[dtype])
        dot = tl.float16 if dtype == "float16" else tl.bfloat16
        for ptx in (True, False):
            args = (unpack.probe_bytes(bits), out)
            constexprs = {"BITS": bits, "N": unpack.PROBE_ROWS, "D": unpack.PROBE_COLUMNS, "PTX": ptx, "DOT": dot}
            launches.append(_runtime.Launch(unpack._probe_kernel, (1,), args, constexprs, 4, 3))
    return _keys(launches, arch)


class DryRun:
    """A pytest plug-in: each test runs with its launches recorded for `target` (none run), its failures
    ignored; the keys, by test."""

    def __init__(self, target) -> None:
        self.target, self.keys, self.tests, self.skipped, self.reasons = target, set(), 0, 0, []

    @staticmethod
    def _ignoring_failures(inner):
        from hypothesis.errors import UnsatisfiedAssumption

        def run(*args, **kwargs):
            try:
                return inner(*args, **kwargs)
            except UnsatisfiedAssumption:  # a dropped example stays dropped: the draws stay the step's
                raise
            except Exception:  # outputs are never computed: every check may fail
                return None

        run._dry_run = True
        return run

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config) -> None:
        from conformance import plugin  # deferred: run in the dry run's child

        if not config.pluginmanager.has_plugin("conformance.plugin"):
            return
        for impl in plugin.implementations(config):  # the compiled claims, on CPU tensors
            caps = impl.capabilities
            if "cpu" not in caps.devices:
                impl.capabilities = dataclasses.replace(caps, devices=(*caps.devices, "cpu"))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            handle = getattr(getattr(item, "obj", None), "hypothesis", None)
            if handle is not None and not getattr(handle.inner_test, "_dry_run", False):
                handle.inner_test = self._ignoring_failures(handle.inner_test)
            # a test marked `gpu` runs: its launches are recorded for the GPU, none runs (conftest.py skips it)
            item.own_markers[:] = [m for m in item.own_markers if not _skips_for_cuda(m)]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        from pnmix import _runtime  # deferred: run in the dry run's child

        with _runtime.recording(self.target) as launches:
            try:
                return (yield)
            finally:
                self.tests += 1
                self.keys |= _keys(launches, self.target.arch)

    def pytest_runtest_logreport(self, report) -> None:
        if report.skipped and report.when in ("setup", "call"):
            self.skipped += 1
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            if reason not in self.reasons and len(self.reasons) < 3:
                self.reasons.append(reason)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        """A test that is not hypothesis' fails where it reads an output: ignored, the launches before kept."""
        if hasattr(pyfuncitem.obj, "hypothesis"):
            return None
        args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        with contextlib.suppress(Exception):
            pyfuncitem.obj(**args)
        return True


def _skips_for_cuda(mark) -> bool:
    return mark.name == "skip" and str(mark.kwargs.get("reason", "")).startswith("needs CUDA")


def _pytest_keys(args: list[str], target) -> dict:
    dry = DryRun(target)
    argv = [*args, "-q", "-p", "no:cacheprovider", "--device", "cpu"]
    if "no:conformance.plugin" not in args:
        argv.append("--no-conformance-json")
    with contextlib.redirect_stdout(sys.stderr):
        code = pytest.main(argv, plugins=[dry])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise RuntimeError(f"pytest {' '.join(args)} ended with {code!r}")
    return {"keys": dry.keys, "tests": dry.tests, "skipped": dry.skipped, "skip_reasons": dry.reasons}


def _fill(cache, kv, length: int, goal: int, chunk: int) -> int:
    """Append chunks of up to `chunk` tokens (`kv(n)`: keys and values) until the cache holds `goal`."""
    while length < goal:
        n = min(chunk, goal - length)
        cache.append(*kv(n))
        length += n
    return length


def _walk(point: dict, capturable: bool) -> int:
    """A model point's cache of one layer, walked as the suite walks it: the prompt, then each ("fill", length)
    and ("steps", n) of point["plan"] (a decode step: one token appended, one query attended)."""
    import torch

    from benchmarks.efficiency import harness  # deferred: run in the dry run's child
    from pnmix import PNMixCache  # deferred: run in the dry run's child

    kv_heads, n_rep, d = point["layer"]
    batch, dtype = point["batch"], harness.MODEL_DTYPE

    def tensors(n: int):  # queries, keys, values: zeros (their shapes decide the launches; no kernel runs)
        return tuple(torch.zeros(batch, h, n, d, dtype=dtype) for h in (kv_heads * n_rep, kv_heads, kv_heads))

    def kv(n: int):
        return tuple(torch.empty(batch, kv_heads, n, d, dtype=dtype) for _ in range(2))

    cache = PNMixCache(
        harness.point_config(point["method"]),
        max_cache_len=point["capacity"],
        check_finite=harness.CHECK_FINITE,
        capturable=capturable,
    )
    length = point["prompt"]
    cache.prefill(*tensors(length))
    for what, n in point["plan"]:
        if what == "fill":
            length = _fill(cache, kv, length, n, harness.FILL_CHUNK)
        for _ in range(n if what == "steps" else 0):
            q, k, v = tensors(1)
            cache.append(k, v)
            cache.attend(q, scale=d**-0.5, softcap=None)
            length += 1
    return length


def _point_launches(point: dict) -> None:
    """Run one benchmark point's work (`point["kind"]`): its launches go to the recording in force."""
    import torch

    from benchmarks.efficiency import harness  # deferred: run in the dry run's child
    from pnmix.kernels import ptx_unpack  # deferred: run in the dry run's child

    kind = point["kind"]
    if kind in ("kernel", "launch", "ptx"):
        cache, q = harness.build_decode_cache(
            point["method"],
            point["batch"],
            point["context"],
            tuple(point["layer"]),
            torch.device("cpu"),
            point["prompt"],
        )
        if kind == "kernel":
            cache.attend(q)
        elif kind == "ptx":
            from pnmix.kernels import decode_attention  # deferred: run in the dry run's child

            for asked in (False, True):
                with ptx_unpack.request(asked):
                    decode_attention(q, cache.region(), cache.cache_layout)
        else:
            from pnmix.kernels import decode_attention  # deferred: run in the dry run's child
            from pnmix.kernels.attention import default_splits  # deferred: run in the dry run's child

            region, layout = cache.region(), cache.cache_layout
            length = region.capacity or cache.length
            splits = point["split_factor"] * default_splits(
                point["batch"] * point["layer"][0], length, point["block_n"]
            )
            choice = {"block_n": point["block_n"], "num_warps": point["warps"], "num_stages": point["stages"]}
            decode_attention(q, region, layout, num_splits=splits, **choice)
    elif kind == "walk":
        from pnmix.cache import why_not_capturable  # deferred: run in the dry run's child

        _walk(point, capturable=False)
        if point.get("twin") and why_not_capturable(harness.point_config(point["method"])) is None:
            _walk({**point, "plan": point["twin"]}, capturable=True)
    else:
        raise ValueError(f"unknown point kind {kind!r}")


def _points_keys(points: list[dict], target) -> dict:
    from pnmix import _runtime  # deferred: run in the dry run's child

    keys = set()
    for point in points:
        with _runtime.recording(target) as launches:
            _point_launches(point)
        keys |= _keys(launches, target.arch)
    return {"keys": keys, "tests": len(points), "skipped": 0, "skip_reasons": []}


def dry_run(spec: dict) -> dict:
    """Each step's keys (the PTX self-test's added to every step that decodes), tests and skipped tests."""
    from pnmix import _runtime  # deferred: run in the dry run's child
    from pnmix.aot import DECODE_KERNEL  # deferred: run in the dry run's child

    target = _runtime.Target(*spec["target"])
    probe = probe_keys(target.arch)
    out = {}
    for name, step in spec["steps"].items():
        found = _pytest_keys(step["pytest"], target) if "pytest" in step else _points_keys(step["points"], target)
        if any(f":{DECODE_KERNEL}:" in key for key in found["keys"]):
            found["keys"] |= probe
        out[name] = {**found, "keys": sorted(found["keys"])}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.commands.specializations SPEC_JSON", file=sys.stderr)
        return 2
    result = dry_run(json.loads(argv[0]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
