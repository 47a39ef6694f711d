"""The switch of the PTX unpack: whether the decode kernel turns its value codes into float16 or bfloat16 by inline PTX
(`pnmix.kernels.unpack.field_codes`, pnmix/kernels/NOTES.md "The PTX unpack behind a switch") or plainly.

On by default, off with PNMIX_PTX_UNPACK=0 in the environment or `request(False)`. Never on under the Triton
interpreter (it cannot run inline PTX), and on a CUDA device only after its self-test passed there: at the first
launch that asks for it, the probe kernel (`unpack.probe`) unpacks every byte at every shift of every plane width
of each dtype both ways, and the PTX path is kept only where both agree with the host's codes bit for bit. Each
compiled decode kernel that takes the path is checked once more, from its TTGIR, for four elements of one shift
per inline-asm call (`pnmix.kernels.ttgir`); a kernel that fails is launched again plainly
(`attention.decode_attention`). Either failure turns the path off for that device with exactly one warning naming
the device and what differed; each device's decision is kept for the process. While launches are recorded
(`pnmix.aot`) the request alone decides: nothing runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

from pnmix import _runtime
from pnmix.kernels import ttgir, unpack

ENV = "PNMIX_PTX_UNPACK"
_ON = ("", "1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")
_requested: bool | None = None  # request()'s setting; None: the environment's
#: Each device's decision, (on, why), by `device_key`.
_decisions: dict[str, tuple[bool, str]] = {}
#: Whether each compiled kernel (by its hash) hands the PTX four elements of one shift per call.
_kernels: dict[str, bool] = {}


def requested() -> bool:
    """Whether the PTX unpack is asked for: `request`'s setting, else PNMIX_PTX_UNPACK (on when unset or empty)."""
    if _requested is not None:
        return _requested
    value = os.environ.get(ENV, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{ENV}={value!r}: set it to 1 (ask for the PTX unpack) or 0 (the plain unpack)")
    return value in _ON


@contextmanager
def request(on: bool | None) -> Iterator[None]:
    """Ask for the PTX unpack (True), refuse it (False) or leave it to the environment (None) within the block."""
    global _requested
    previous, _requested = _requested, on
    try:
        yield
    finally:
        _requested = previous


def device_key(index: int) -> str:
    """How warnings and records name a CUDA device: its name and index."""
    return f"{torch.cuda.get_device_name(index)} (cuda:{index})"


def active() -> bool:
    """Whether decode launches take the PTX path now (where their configuration allows: `attention.value_ptx`)."""
    if not requested():
        return False
    if _runtime.recording_launches():
        return True  # compiled ahead of time, run nowhere: the gate checks the compiled grouping itself
    if _runtime.INTERPRETED:
        return False
    index = torch.cuda.current_device()
    key = device_key(index)
    if key not in _decisions and torch.cuda.is_current_stream_capturing():
        return False  # no self-test inside a graph capture: plain until one has run outside
    return decide(key, lambda: run_probe(torch.device("cuda", index)))


def run_probe(device: torch.device) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """The probe's codes for every dtype and plane width the PTX takes (`unpack.PROBED`), (PTX, plain), on the host
    (the CUDA part of the self-test)."""
    return {
        (dtype, bits): tuple(unpack.probe(bits, use, device, dtype).cpu() for use in (True, False))
        for dtype, bits in unpack.PROBED
    }


def decide(device: str, probe: Callable[[], Mapping[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]]) -> bool:
    """The PTX unpack's decision for `device`, made once per process from probe() (codes by dtype and width: PTX,
    plain),
    then kept; off with one warning when the codes differ or the probe fails (a device whose ptxas refuses the PTX)."""
    if device not in _decisions:
        try:
            results = probe()
        except Exception as exc:  # any failure of the self-test keeps the plain path
            on, why = False, f"its self-test did not run ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        else:
            on, why = compare(results)
        _decisions[device] = (on, why)
        if not on:
            _warn(device, why)
    return _decisions[device][0]


def compare(results: Mapping[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]) -> tuple[bool, str]:
    """(on, why) from the probe's codes of each dtype and plane width: on where every pair of `unpack.PROBED` was
    probed and, for each, the PTX codes, the plain ones and the host's (`unpack.expected_codes`) are the same bits."""
    missing = sorted(set(unpack.PROBED) - set(results))
    if missing:
        return False, f"its self-test left out (dtype, plane width) {missing}"
    for dtype, bits in unpack.PROBED:
        expected = unpack.expected_codes(bits, dtype)
        for name, got in zip(("PTX", "plain"), results[dtype, bits], strict=True):
            if got.shape != expected.shape or got.dtype != expected.dtype:
                return False, f"{bits}-bit {dtype} codes by the {name} unpack came back {got.dtype} {tuple(got.shape)}"
            wrong = (got.view(torch.int16) != expected.view(torch.int16)).nonzero()
            if len(wrong):
                row, col = wrong[0].tolist()
                shift = col // (unpack.PROBE_COLUMNS // (8 // bits)) * bits
                byte = int(unpack.probe_bytes(bits)[row, col % (unpack.PROBE_COLUMNS // (8 // bits))])
                return False, (
                    f"{len(wrong)} of {expected.numel()} {bits}-bit {dtype} codes by the {name} unpack differ from the "
                    "host's "
                    f"(first: byte {byte:#04x} at shift {shift}, {float(got[row, col])} instead of "
                    f"{float(expected[row, col])})"
                )
    return True, "self-test passed: PTX and plain codes equal for every byte, shift, plane width and dtype"


def kernel_groups_by_shift(compiled) -> bool:
    """Whether a compiled kernel that took the PTX path hands each inline-asm call four elements of one shift (its
    TTGIR, `ttgir.grouping_problems`; checked once per kernel). One that does not turns the path off for the current
    device, with one warning."""
    key = getattr(compiled, "hash", None) or str(id(compiled))
    if key not in _kernels:
        problems = ttgir.grouping_problems(compiled.asm["ttgir"])
        _kernels[key] = not problems
        if problems:
            device = device_key(torch.cuda.current_device())
            was_on = _decisions.get(device, (True, ""))[0]
            _decisions[device] = (False, f"kernel {getattr(compiled, 'name', '?')}: {problems[0]}")
            if was_on:
                _warn(device, _decisions[device][1])
    return _kernels[key]


def state() -> dict:
    """What the switch says now, for records: asked for, the current CUDA device, and whether decode launches take the
    PTX path there (`active`) and why."""
    compiled = torch.cuda.is_available() and not _runtime.INTERPRETED
    device = device_key(torch.cuda.current_device()) if compiled else None
    on = active()
    if not requested():
        why = f"turned off ({ENV}=0 or request(False))"
    elif not compiled:
        why = "the Triton interpreter runs no inline PTX"
    else:
        why = _decisions.get(device, (on, "no self-test yet (inside a graph capture)"))[1]
    return {"requested": requested(), "device": device, "on": on, "why": why}


def _warn(device: str, why: str) -> None:
    warnings.warn(f"pnmix: the PTX unpack is off on {device}: {why}; decoding unpacks plainly", RuntimeWarning, 3)
