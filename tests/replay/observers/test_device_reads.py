"""The MRV2 observer's device reads (families/vllm/mrv2/observer.py `DeviceReads`): on a CPU the
values are read at once; on CUDA they are copied without blocking and read a step later, in
order, without a host sync in the step that made them."""

from __future__ import annotations

import pytest
import torch

from specreplay.replay.families.vllm.mrv2.observer import DeviceReads


def test_cpu_tensors_are_read_at_once():
    reads, got = DeviceReads(), []
    reads.read([torch.tensor([1, 2, 3]), torch.tensor([[4, 5]])], got.append)
    assert got == [[[1, 2, 3], [[4, 5]]]] and not reads.pending


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_are_read_at_the_next_resolve_in_order():
    reads, got = DeviceReads(), []
    a = torch.arange(4, device="cuda")
    reads.read([a], lambda values: got.append(("a", values)))
    a += 10  # after the copy was enqueued: the read keeps the value at read time
    reads.read([a], lambda values: got.append(("b", values)))
    assert got == []  # nothing read yet: no sync in this step
    reads.resolve()
    assert got == [("a", [[0, 1, 2, 3]]), ("b", [[10, 11, 12, 13]])] and not reads.pending
