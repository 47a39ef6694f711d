"""Where Triton kernels run: compiled on CUDA, under the Triton interpreter on the CPU.

TRITON_INTERPRET must be set before `triton.jit` decorates a kernel, so this module is
imported before any kernel module. Without CUDA it sets TRITON_INTERPRET=1 unless the user
set it; with CUDA it leaves the setting to the user (default: compiled).
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_device() -> torch.device:
    """The device whose tensors the kernels take: CPU under the interpreter, else CUDA."""
    return torch.device("cpu") if INTERPRETED else torch.device("cuda")


def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels read tensors on `kernel_device()` only; say so instead of failing inside Triton."""
    expected = kernel_device()
    if t.device.type != expected.type:
        mode = "the Triton interpreter (TRITON_INTERPRET=1)" if INTERPRETED else "compiled Triton (CUDA)"
        raise ValueError(f"{name} must be on {expected.type} for {mode}, got {t.device}")
