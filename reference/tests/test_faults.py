"""Injected faults fail what can fail (allocations, kernels, copies), never a metadata read."""

import pytest
import torch

from reference.contract.faults import FaultAt, InjectedFault


def read_metadata(t: torch.Tensor) -> None:
    t.shape, t.device, t.dtype, t.ndim, t.is_cuda, t.layout, t.requires_grad  # noqa: B018
    t.size(), t.size(-1), t.dim(), t.stride(), t.numel(), t.element_size(), t.is_contiguous(), len(t)


def test_metadata_reads_are_never_failed_nor_counted():
    t = torch.zeros(2, 3)
    with FaultAt(0) as fault:
        read_metadata(t)
        assert not fault.fired and fault.calls == 0
        with pytest.raises(InjectedFault, match="torch call 0"):
            torch.zeros(1)
    assert fault.fired


@pytest.mark.parametrize("at", [0, 1, 2])
def test_the_nth_call_that_can_fail_raises(at):
    t = torch.ones(4)
    done = []
    with pytest.raises(InjectedFault), FaultAt(at):
        for i in range(3):
            read_metadata(t)
            t = t + 1  # an allocation and a kernel
            done.append(i)
    assert done == list(range(at))
