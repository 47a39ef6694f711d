"""Injected faults: the n-th torch call made inside an operation raises. The conformance suite
fails every implementation's calls with it (property 10); an implementation can test itself.

Any implementation built on torch (its kernels' launches included: they read and write torch
tensors) is failed at a point of its own work without the suite knowing its internals: the
allocation, the copy or the launch that happens to be the n-th. The fault is an out-of-memory
error, the failure a real allocation or launch would give."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


class InjectedFault(torch.OutOfMemoryError):
    """Raised by `FaultAt` in place of the n-th torch call."""


#: Tensor methods that only read what a tensor already holds (its shape, strides, storage): they
#: allocate nothing, copy nothing and launch nothing, so they cannot fail and are never failed.
METADATA = frozenset(
    {
        "size",
        "dim",
        "stride",
        "numel",
        "nelement",
        "element_size",
        "storage_offset",
        "data_ptr",
        "get_device",
        "untyped_storage",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "is_signed",
        "__len__",
    }
)


def can_fail(func) -> bool:
    """Whether a torch call can fail: an allocation, a kernel, a copy; not an attribute read
    (`t.shape`, `t.device`: a descriptor's `__get__`) or a `METADATA` query."""
    return getattr(func, "__name__", None) not in METADATA | {"__get__"}


class FaultAt(TorchFunctionMode):
    """Within `with FaultAt(n):`, torch calls that can fail (`can_fail`) 0 .. n - 1 run and call n
    raises InjectedFault (n None: none does); `fired` says whether it did and `calls` counts the
    calls that could have failed."""

    def __init__(self, n: int | None) -> None:
        super().__init__()
        self.n, self.calls, self.fired = n, 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not can_fail(func):
            return func(*args, **(kwargs or {}))
        if self.calls == self.n:
            self.fired = True
            self.calls += 1
            raise InjectedFault(f"injected fault at torch call {self.n} ({getattr(func, '__name__', func)})")
        self.calls += 1
        return func(*args, **(kwargs or {}))
