"""Whether PN-Mix's Triton kernels run under the Triton interpreter, decided when `pnmix` is imported and before
triton is: TRITON_INTERPRET must be set before triton decorates its own library functions (when it is first
imported) and before `triton.jit` decorates a kernel. Without CUDA it sets TRITON_INTERPRET=1 unless the user set
it; with CUDA it leaves the setting to the user (default: compiled). Importing this imports torch, not triton
(`pnmix._runtime`, which the kernels import, checks triton itself)."""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
