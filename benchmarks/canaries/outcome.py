"""What a canary gives, and whether two of them agree.

An outcome is {"exact": {part: value}, "floats": {part: [float, ...]}}. Exact parts are what the code decides
(stored bytes as a digest, masks, chosen tokens, argmaxes) and must be equal. Float parts are compared as vectors:
they agree while max |a - b| <= RTOL * max(max |a|, FLOOR), a bound that the arithmetic of another CPU or another
thread count (another summation order in float32) stays far inside and that a change of the numerics leaves.
"""

from __future__ import annotations

import hashlib
import math

import torch

#: Relative tolerance of float parts (float32 carries ~1e-7; another summation order moves a few ulps).
RTOL = 1e-4
#: The scale below which a vector counts as that small (its differences are judged against this).
FLOOR = 1e-3
#: How many fixed directions a float tensor is summarised by (`summary`).
DIRECTIONS = 8


def digest(*tensors: torch.Tensor) -> str:
    """sha256 (16 hex digits) of the tensors' shapes, dtypes and bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def summary(x: torch.Tensor) -> list[float]:
    """A float tensor as its projections onto DIRECTIONS fixed seeded directions, in float64, each of the
    size of a typical entry: a change of the entries beyond the tolerance moves them, and a result records
    a few numbers instead of the tensor."""
    flat = x.detach().cpu().double().flatten()
    directions = torch.randn(DIRECTIONS, flat.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return [float(v) for v in directions @ flat / math.sqrt(max(flat.numel(), 1))]


def outcome(exact: dict, floats: dict) -> dict:
    return {"exact": dict(exact), "floats": {k: [float(v) for v in vs] for k, vs in floats.items()}}


def floats_agree(a: list[float], b: list[float], rtol: float = RTOL) -> bool:
    if len(a) != len(b):
        return False
    if any(math.isnan(x) != math.isnan(y) for x, y in zip(a, b, strict=True)):
        return False
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if not (math.isnan(x) and math.isnan(y))]
    scale = max([FLOOR, *(abs(v) for p in pairs for v in p)])
    return all(abs(x - y) <= rtol * scale for x, y in pairs)


def moved(recorded: dict, now: dict, rtol: float = RTOL) -> list[str]:
    """The parts of `recorded` that `now` does not reproduce (a part either lacks counts as moved), sorted."""
    out = []
    rec_exact, now_exact = recorded.get("exact") or {}, now.get("exact") or {}
    for part in sorted(set(rec_exact) | set(now_exact)):
        if part not in rec_exact or part not in now_exact or rec_exact[part] != now_exact[part]:
            out.append(part)
    rec_floats, now_floats = recorded.get("floats") or {}, now.get("floats") or {}
    for part in sorted(set(rec_floats) | set(now_floats)):
        both = part in rec_floats and part in now_floats
        if not both or not floats_agree(rec_floats[part], now_floats[part], rtol):
            out.append(part)
    return sorted(out)
