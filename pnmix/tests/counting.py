"""Counting what the host asks of the device: kernels launched and reads that wait on it.

Kernels are counted by wrapping the launchers: every Triton launch (`kernel[grid](...)`, with
its grid and arguments kept in order), and every aten op that runs a device kernel (a dispatch
mode that leaves out views, metadata and allocation). Host waits are the ops that read device
data back: `.item()` and `bool(t)` dispatch to `_local_scalar_dense`, and `tolist()` is wrapped.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import MutableMapping

import torch
import triton.runtime.jit
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that launch nothing on the device: views, metadata, allocation, host-side tensors.
NO_KERNEL = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "lift_fresh",
        "set_",
        "resize_",
        "view",
        "_unsafe_view",
        "_reshape_alias",
        "slice",
        "select",
        "as_strided",
        "t",
        "transpose",
        "permute",
        "expand",
        "unsqueeze",
        "squeeze",
        "alias",
        "detach",
        "split",
        "unbind",
    }
)
#: aten ops whose result the host reads (a device->host sync on CUDA) or whose shape depends on data.
SYNCS = frozenset({"_local_scalar_dense", "is_nonzero", "item", "equal", "nonzero", "masked_select", "unique"})


def _describe(value: object) -> object:
    """A launch argument as the launch sequence keeps it: a tensor by its storage, shape, strides
    and dtype (what a captured graph would bake in), anything else as it is."""
    if isinstance(value, torch.Tensor):
        return (
            "tensor",
            value.untyped_storage().data_ptr(),
            value.storage_offset(),
            tuple(value.shape),
            value.stride(),
            value.dtype,
        )
    if isinstance(value, (list, tuple)):
        return tuple(map(_describe, value))
    return value


class Launches(TorchDispatchMode):
    """Device kernels (Triton launches and aten ops) and host reads of device data, while active
    (and, when `scoped`, inside the functions `counting` was told to watch)."""

    def __init__(self, scoped: bool = False) -> None:
        super().__init__()
        self.kernels: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        # Device work in order: Triton launches (kernel, grid, arguments, options) and aten ops (name, arguments)
        self.sequence: list[tuple] = []
        self._in_triton = 0  # the interpreter's own tensor traffic is part of one launch
        self._inside = 0 if scoped else 1

    @property
    def total(self) -> int:
        return sum(self.kernels.values())

    @property
    def aten(self) -> int:
        return sum(n for name, n in self.kernels.items() if name.startswith("aten."))

    @property
    def triton(self) -> int:
        return self.total - self.aten

    @property
    def counting(self) -> bool:
        return self._inside > 0 and not self._in_triton

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.counting:
            if name in SYNCS:
                self.syncs[name] += 1
            elif name not in NO_KERNEL:
                self.kernels[f"aten.{name}"] += 1
                described = (
                    tuple(map(_describe, args)),
                    tuple(sorted((k, _describe(v)) for k, v in (kwargs or {}).items())),
                )
                self.sequence.append((f"aten.{name}", *described))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting(monkeypatch, watch: tuple[tuple[object, str], ...] = ()):
    """Count while active; with `watch`, only inside the functions it names: (owner, attribute)
    pairs, or (mapping, key) for a function held in a registry such as transformers' attention
    functions."""
    mode = Launches(scoped=bool(watch))
    launch_at = triton.runtime.jit.KernelInterface.__getitem__
    tolist = torch.Tensor.tolist

    def getitem(kernel, grid):
        run = launch_at(kernel, grid)

        def counted(*args, **kwargs):
            if mode.counting:
                name = kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel)
                mode.kernels[name] += 1
                options = tuple(sorted((k, _describe(v)) for k, v in kwargs.items()))
                mode.sequence.append((name, tuple(grid), tuple(map(_describe, args)), options))
            mode._in_triton += 1
            try:
                return run(*args, **kwargs)
            finally:
                mode._in_triton -= 1

        return counted

    def counted_tolist(t):
        if mode.counting:
            mode.syncs["tolist"] += 1
        return tolist(t)

    def scoped(function):
        def inside(*args, **kwargs):
            mode._inside += 1
            try:
                return function(*args, **kwargs)
            finally:
                mode._inside -= 1

        return inside

    with monkeypatch.context() as m:
        m.setattr(triton.runtime.jit.KernelInterface, "__getitem__", getitem)
        m.setattr(torch.Tensor, "tolist", counted_tolist)
        for owner, name in watch:
            if isinstance(owner, MutableMapping):
                m.setitem(owner, name, scoped(owner[name]))
            else:
                m.setattr(owner, name, scoped(getattr(owner, name)))
        with mode:
            yield mode
