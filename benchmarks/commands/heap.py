"""Memory handed back between units of a long run: cyclic garbage collected, the C heap's free pages returned.

A long evaluation allocates and frees gigabytes of tensors per context. Two things keep them:
- Tensors reachable only from a reference cycle (a cache and an object that points back at it, in
  this code or a plug-in's) wait for Python's cyclic collector, which runs on counts of Python
  objects, not bytes: a few cycles can hold every cache of many contexts. Seen in a 50-document
  sweep: one worker held about 50,000 tensors (5.1 GB) of caches of every kind mid-run, while the
  same contexts with a collection after each stay at about 400 tensors.
- glibc's allocator keeps freed memory inside its heap, below live blocks (one call of
  `malloc_trim(0)` brought a worker from 6.5 to 1.8 GB resident).
`trimmed` collects and trims after each unit (about 0.1 s; the units are contexts of tens of seconds).
Where the C library has no `malloc_trim` (macOS, musl), only the collection happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
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
    """Collect cyclic garbage, then hand the heap's free pages back to the operating system (glibc's malloc_trim(0))."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def trimmed(items: Iterable[T]) -> Iterator[T]:
    """Each of `items`, with the heap's free memory handed back once the caller is done with it."""
    for item in items:
        yield item
        return_free_heap()
