"""The C heap's free memory handed back to the operating system between units of a long run.

A long evaluation allocates and frees gigabytes of tensors per context. glibc's allocator keeps
freed memory inside its heap, below live blocks, and RSS grows run after run although the live
tensors stay the same (a 50-document sweep grew by 90-160 MB per context and process; one call of
glibc's `malloc_trim(0)` brought a worker from 6.5 to 1.8 GB). `trimmed` calls it after each unit.
Where the C library has no `malloc_trim` (macOS, musl), nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()
#: Whether this C library can hand free heap memory back (glibc).
AVAILABLE = _TRIM is not None


def return_free_heap() -> None:
    """Hand the heap's free pages back to the operating system (glibc's malloc_trim(0); milliseconds)."""
    if _TRIM is not None:
        _TRIM(0)


def trimmed(items: Iterable[T]) -> Iterator[T]:
    """Each of `items`, with the heap's free memory handed back once the caller is done with it."""
    for item in items:
        yield item
        return_free_heap()
