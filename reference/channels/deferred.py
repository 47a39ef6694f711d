"""Input checks done on the device and read back later: no host sync where the caller cannot afford one (a
decode step captured in a CUDA graph, or traced by `torch.compile`, where reading a value back breaks the graph).

Each checked call folds max |x| of its inputs (NaN and Inf carry through a maximum) into a small float32 buffer,
`flags` [2, len(WATCHED)]: the last call's maxima and the worst since the cache began. Reading the buffer back
(one device->host copy) and judging it with `reference.channels.validation.value_problem` names the first bad
argument. A cache that checks this way has already stored what it was given by then, so it refuses further use
once a problem is read.
"""

from __future__ import annotations

import math

import torch

from reference.channels import validation
from reference.channels.config import PNMixConfig

#: The inputs watched, in the flags' column order.
WATCHED = ("k", "v", "q")
#: Bytes of the flags: float32 [2, len(WATCHED)].
FLAG_BYTES = 2 * len(WATCHED) * 4


def check_finite_mode(value: object) -> bool | str:
    """`check_finite` as given, checked: True (on the device, reported later), "eager" or False."""
    if isinstance(value, bool) or (isinstance(value, str) and value == "eager"):
        return value
    raise TypeError(f"check_finite must be True, False or 'eager', got {value!r}")


def new_flags(device) -> torch.Tensor:
    return torch.zeros(2, len(WATCHED), dtype=torch.float32, device=device)


def watch(flags: torch.Tensor, **inputs: torch.Tensor) -> None:
    """Fold max |x| of each input into `flags`: device work only, one reduction per input and one maximum, into
    fixed buffers (a CUDA graph replays them; `torch.compile` traces them without a graph break)."""
    last, worst = flags
    with torch.no_grad():  # out= takes no autograd inputs; a check needs no graph
        for name, t in inputs.items():
            if t.numel():
                torch.linalg.vector_norm(t, math.inf, dtype=torch.float32, out=last[WATCHED.index(name)])
        torch.maximum(worst, last, out=worst)


def problem(worst: list[float], config: PNMixConfig, where: str) -> str | None:
    """The first problem of the worst maxima read back (`validation.value_problem`), worded for a cache that went on
    with it; None when every watched input was fine."""
    bits = {"k": config.b_low, "v": config.value_bits if config.values_quantized else None, "q": None}
    for name, top in zip(WATCHED, worst, strict=True):
        found = validation.value_problem(name, top, config, bits[name])
        if found is not None:
            return (
                f"{found} (given to {'attend' if name == 'q' else 'append'} since prefill, checked on the device and "
                f"read back by {where}); this cache went on with it and refuses further use: build a new one"
            )
    return None


__all__ = ["FLAG_BYTES", "WATCHED", "check_finite_mode", "new_flags", "problem", "watch"]
