"""Which canaries a result records, running them once per process, and what a result records of what
decides it (`record`): the outcomes of its canaries, the model's fingerprint, its data's digests and the
versions of the libraries that change numerics. `moved` says which of a result's canaries, or which of
its data files, this tree and these libraries no longer reproduce.

Canaries are named:
- "method:NAME": the method NAME of `reference.methods` through its spec cache (`methods.run`);
- "hf:LAYOUT:NAME": the method through `pnmix.hf.PNMixHFCache` on the tiny model of LAYOUT (`pipelines.hf`);
- "impl:NAME": the implementation NAME (a plug-in) through `PNMixHFCache(impl=...)` (`pipelines.implementation`);
- "pipeline:TOOL": a tool's own pipeline, run by the function the tool hands over (`Pipelines`): each tool
  defines its canary beside the code it stands for, and the report hands every tool's to `moved`, so that
  the canaries import no tool and no tool imports itself back through them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Callable, Iterable, Mapping

import torch

from benchmarks.canaries import methods, outcome, pipelines, workloads
from reference import methods as registry
from reference.records import ROOT, code_key, code_path, file_digest
from reference.records import versions as _versions

#: A tool's canary by the pipeline name results record it under: run with no argument, it returns an outcome.
Pipelines = Mapping[str, Callable[[], dict]]

#: Libraries whose versions change numerics (recorded; the canaries say whether they did).
NUMERICS = ("torch", "transformers", "lm-eval")
#: Torch's threads while a canary runs: the same summation order on every machine wherever torch lets one.
THREADS = 1


def names_for(used: Iterable[str] = (), pipeline: Iterable[str] = ()) -> list[str]:
    """The canaries of a result that used `used` (method names of the registry, or "impl:NAME" for a plug-in)
    and the tools' pipelines named in `pipeline`: each method's spec cache and its path through transformers
    on every layout, each implementation, each pipeline."""
    out = []
    for name in dict.fromkeys(used):
        if name.startswith("impl:"):
            out.append(name)
        elif name in registry.REGISTRY:
            out += [f"method:{name}", *(f"hf:{layout}:{name}" for layout in workloads.LAYOUTS)]
        else:
            raise ValueError(f"no canary for {name!r}: a method of reference.methods or 'impl:NAME'")
    if isinstance(pipeline, str):
        raise TypeError(f"pipeline must be the tools' pipelines by name (a mapping), got the string {pipeline!r}")
    out += [f"pipeline:{name}" for name in pipeline]
    return out


def describe(name: str) -> str:
    """A canary's name as a reader reads it."""
    kind, _, rest = name.partition(":")
    if kind == "method":
        return f"{rest} (spec cache)"
    if kind == "hf":
        layout, _, method = rest.partition(":")
        return f"{method} through the transformers cache ({layout})"
    if kind == "impl":
        return f"implementation {rest}"
    return f"the {rest} pipeline"


#: Set while a canary runs: no progress bars; one process, whatever launched this one (a canary's own model
#: must not join the launch's process group: it runs the same fixed work in every process).
CANARY_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}


@contextlib.contextmanager
def _quiet_and_single_threaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    saved = {name: os.environ.get(name) for name in CANARY_ENV}
    os.environ.update(CANARY_ENV)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def compute(name: str, tool: Callable[[], dict] | None = None) -> dict:
    """Run the canary `name` now (no cache); a pipeline's by the `tool`'s canary that stands for it."""
    kind, _, rest = name.partition(":")
    with _quiet_and_single_threaded():
        if kind == "method":
            return methods.run(rest)
        if kind == "hf":
            layout, _, method = rest.partition(":")
            return pipelines.hf(layout, method)
        if kind == "impl":
            return pipelines.implementation(rest)
        if kind == "pipeline":
            if tool is None:
                raise ValueError(f"no canary given for the {rest} pipeline (the tool hands its own over)")
            return tool()
    raise ValueError(f"not a canary name: {name!r}")


@functools.cache
def _cached(name: str, tool: Callable[[], dict] | None = None) -> tuple[dict | None, str]:
    try:
        return compute(name, tool), ""
    except Exception as error:  # a canary that cannot run here moved
        return None, f"{type(error).__name__}: {error}"


def run(name: str, tool: Callable[[], dict] | None = None) -> dict:
    """The canary `name` (a pipeline's run by `tool`), computed once per process (a report runs each canary
    once, however many results recorded it); an exception if it cannot run."""
    result, error = _cached(name, tool)
    if result is None:
        raise RuntimeError(f"canary {name} cannot run: {error}")
    return copy.deepcopy(result)


def versions() -> dict[str, str]:
    return _versions(NUMERICS)


def record(
    used: Iterable[str] = (), pipeline: Pipelines | None = None, *, model_fingerprint=None, data: Iterable = ()
) -> dict:
    """What decides a result (its `behaviour` field): {"canaries": {name: outcome}, "model_fingerprint",
    "data": {file: sha256}, "versions"}. A canary that cannot run here is recorded as {"error": why}: the
    result is kept (hours of measurement are not lost to it) and is never current."""
    files = {code_key(p.resolve() if hasattr(p, "resolve") else ROOT / str(p)): file_digest(p) for p in data}
    canaries = {}
    pipeline = pipeline or {}
    for name in names_for(used, pipeline):
        result, error = _cached(name, _tool(name, pipeline))
        canaries[name] = copy.deepcopy(result) if result is not None else {"error": error}
    return {
        "canaries": canaries,
        "model_fingerprint": model_fingerprint,
        "data": dict(sorted(files.items())),
        "versions": versions(),
    }


def _tool(name: str, pipeline: Pipelines) -> Callable[[], dict] | None:
    """The tool's canary a pipeline canary's name stands for (None for a method's or an implementation's)."""
    kind, _, rest = name.partition(":")
    return pipeline.get(rest) if kind == "pipeline" else None


def moved(behaviour: dict, pipeline: Pipelines | None = None) -> list[str]:
    """What of a recorded `behaviour` this tree does not reproduce, each as a reader reads it: a canary that
    moved (with its parts that did), one that cannot run (a pipeline's whose canary `pipeline` does not hand
    over among them), a data file that changed or is missing."""
    pipeline = pipeline or {}
    out = []
    for name, recorded in sorted((behaviour.get("canaries") or {}).items()):
        if not isinstance(recorded, dict) or "error" in recorded:
            why = recorded.get("error") if isinstance(recorded, dict) else "no outcome"
            out.append(f"{describe(name)}: did not run where the result was written ({why})")
            continue
        result, error = _cached(name, _tool(name, pipeline))
        if result is None:
            out.append(f"{describe(name)}: cannot run ({error})")
            continue
        parts = outcome.moved(recorded, result)
        if parts:
            out.append(f"{describe(name)}: {', '.join(parts)}")
    for key, digest in sorted((behaviour.get("data") or {}).items()):
        path = code_path(key)
        if path is None or file_digest(path) != digest:
            out.append(f"data `{key}` changed" if path is not None else f"data `{key}` is not here")
    return out
