"""The suite's count of the bytes a cache holds: every distinct tensor storage it reaches, once, and
nothing of its derived state (tensors computed from the stored ones to read them faster)."""

import torch

from conformance.harness import held_bytes
from reference.contract import Derived


class Holder:
    def __init__(self, **attributes) -> None:
        self.__dict__.update(attributes)


def test_each_storage_counts_once_and_derived_state_not_at_all():
    stored = torch.zeros(10, dtype=torch.uint8)
    read_back = torch.zeros(10, dtype=torch.float32)
    cache = Holder(
        t={"a": stored, "b": stored[2:]}, parts=[torch.zeros(3, dtype=torch.float16)], back=Derived(k=read_back)
    )
    assert held_bytes(cache) == 10 + 3 * 2
    cache.back = {"k": read_back}  # the same tensors, not marked derived: held
    assert held_bytes(cache) == 10 + 3 * 2 + 10 * 4
