"""Long runs hand the C heap's free memory back after each unit: resident memory follows what is live."""

import gc
import os
import weakref

import pytest
import torch

from benchmarks.commands import heap


def resident_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not heap.AVAILABLE, reason="this C library has no malloc_trim (glibc only)")
def test_memory_freed_inside_the_heap_is_handed_back():
    heap.return_free_heap()
    before = resident_mib()
    blocks = [torch.empty(2000) for _ in range(50_000)]  # 8 KB each: inside the heap, not mmapped
    kept = blocks[::200]  # live blocks spread over the heap keep it from shrinking at its top alone
    del blocks
    held = resident_mib() - before
    assert held > 200  # glibc kept the freed blocks
    heap.return_free_heap()
    assert resident_mib() - before < held / 4
    assert len(kept) == 250


def test_tensors_held_by_a_reference_cycle_are_freed_after_each_unit():
    class Cache:  # a cache and an object pointing back at it: garbage only the cyclic collector finds
        def __init__(self) -> None:
            self.keys = torch.empty(1000)
            self.owner = self

    freed = []
    gc.disable()  # the collector's own schedule must not do the work
    try:
        for built in heap.trimmed(range(3)):
            weakref.finalize(Cache().keys, freed.append, 1)
            assert len(freed) == built  # the one just built is still held by its cycle
    finally:
        gc.enable()
    assert len(freed) == 3


def test_trimmed_yields_every_item_and_trims_after_each(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "return_free_heap", lambda: calls.append(len(seen)))
    seen = []
    for item in heap.trimmed(iter("abc")):
        seen.append(item)
        if item == "b":
            continue  # a unit skipped part-way is trimmed after as well
    assert seen == ["a", "b", "c"] and calls == [1, 2, 3]
