"""What a decode-kernel timing ran, as machine code, so that the timing stays current while its kernels are the same.

On a device, `record` digests the SASS of every kernel launched by one call of the timed function
(`pnmix._runtime.observing`, `pnmix.sass.digest`) and compiles the package's own launches of the point's
configuration again ahead of time for the same GPU (`pnmix.aot.kernel_digests`: method, dtype, head_dim, query
heads per KV head, compute capability, SM count, PTX unpack). Where the two agree the record is faithful: compiling
ahead of time reproduces what was timed. A report on any machine with the triton wheel's toolchain then compiles
them again (`moved`), and the timing is current while every kernel compiles to the SASS it timed, whatever else
changed in the source (`reports.currency`); a record that is not faithful, or a machine that cannot compile,
falls back to the code fingerprint.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import torch

from pnmix import sass


def _digests_by_name(ran) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for name, compiled in ran:
        out.setdefault(name, set()).add(sass.digest_of(compiled))
    return {name: sorted(d) for name, d in sorted(out.items())}


def record(method: str, layer, dtype: torch.dtype, ran, device: torch.device) -> dict:
    """The machine code a timed call ran (ran: `pnmix._runtime.observing`'s list for one call) for a built-in
    method's point of `layer` (KV heads, query heads per KV head, head_dim); "why" when there is none to record."""
    from pnmix import _runtime, aot  # deferred: these import triton, which the report need not load
    from pnmix.kernels import ptx_unpack  # deferred: these import triton, which the report need not load

    if device.type != "cuda" or not ran or any(compiled is None for _, compiled in ran):
        return {"why": "no compiled kernel ran (the interpreter, or not a Triton path)"}
    names = {t: name for name, t in aot.DTYPES.items()}  # the cases pnmix.aot compiles
    if dtype not in names:
        return {"why": f"no ahead-of-time case for dtype {dtype}"}
    _, n_rep, head_dim = layer
    props = torch.cuda.get_device_properties(device)
    target = _runtime.Target(props.major * 10 + props.minor, props.multi_processor_count)
    return record_of(aot.Case(method, names[dtype], int(head_dim), int(n_rep)), target, ptx_unpack.active(), ran)


def record_of(case, target, ptx: bool, ran) -> dict:
    """`record` for an `pnmix.aot.Case` on a `pnmix._runtime.Target`, the PTX unpack on or off, and the compiled
    kernels that ran."""
    import triton

    from pnmix import aot  # deferred: these import triton, which the report need not load

    ran_digests = _digests_by_name(ran)
    try:
        ahead = aot.kernel_digests(case, target, sorted(ran_digests), ptx)
    except Exception as exc:  # the timing stands; only its currency falls back to the code fingerprint
        return {"why": f"could not compile ahead of time: {type(exc).__name__}: {exc}"}
    return {
        "case": dataclasses.asdict(case),
        "target": dataclasses.asdict(target),
        "ptx_unpack": ptx,
        "ran": ran_digests,
        "compiled_ahead": ahead,
        "faithful": ran_digests == ahead,
        "triton": triton.__version__,
    }


def faithful(rec: object) -> bool:
    """Whether a record can decide currency: compiling ahead of time reproduced what was timed."""
    return (
        isinstance(rec, dict)
        and rec.get("faithful") is True
        and isinstance(rec.get("ran"), dict)
        and bool(rec["ran"])
        and rec.get("compiled_ahead") == rec["ran"]
        and all(k in rec for k in ("case", "target"))
    )


@functools.lru_cache(maxsize=64)
def _here(spec: str) -> dict[str, list[str]] | str:
    from pnmix import _runtime, aot  # deferred: these import triton, which the report need not load

    tools = sass.toolchain()
    if isinstance(tools, str):
        return tools
    given = json.loads(spec)
    try:
        return aot.kernel_digests(
            aot.Case(**given["case"]), _runtime.Target(**given["target"]), given["names"], given["ptx_unpack"]
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def moved(rec: dict) -> list[str] | str:
    """The kernels of a faithful record that compile to other SASS here ("_split_kernel (sm_90)"), [] when all
    are the same; a string saying why they cannot be compiled here. Compiled once per configuration and target
    in a process."""
    spec = json.dumps(
        {"case": rec["case"], "target": rec["target"], "names": sorted(rec["ran"]), "ptx_unpack": rec["ptx_unpack"]},
        sort_keys=True,
    )
    here = _here(spec)
    if isinstance(here, str):
        return here
    arch = rec["target"]["arch"]
    return [f"{name} (sm_{arch})" for name in sorted(rec["ran"]) if here.get(name) != rec["ran"][name]]
