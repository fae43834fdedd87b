"""Staged batches on a real GPU (run on the device: python -m pytest -m gpu tests/test_staging_gpu.py).

The thread reuses a slot two batches after the caller got it; when the GPU runs behind, the copies out of that slot
have not run yet, and only the slot's event keeps the thread from overwriting it."""

import pytest
import torch

from libreyolo.data.staging import PinnedStager

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda:0")


def test_copies_queued_behind_a_busy_gpu_get_their_own_batch():
    src = [{"img": torch.full((4, 256, 256, 3), k, dtype=torch.uint8)} for k in range(24)]
    it = PinnedStager(iter(src), DEV)
    on_device = []
    for _ in src:
        batch = next(it)
        assert batch["img"].is_pinned()
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time before each copy: the copies run late
        on_device.append(batch["img"].to(DEV, non_blocking=True))
    torch.cuda.synchronize()
    assert [int(t[0, 0, 0, 0]) for t in on_device] == list(range(24))
    assert all(bool((t == k).all()) for k, t in enumerate(on_device))
