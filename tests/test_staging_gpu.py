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


def test_uploaded_keys_arrive_on_the_device_in_order_behind_a_busy_stream():
    """The thread copies `to_device` keys on its own stream as soon as it stages a batch; the caller's stream
    waits for that copy, and a slot's device buffer is rewritten only after the step that read it has run (two
    slots: the thread refills the one the caller let go while the GPU still runs the work queued on it)."""
    src = [{"img": torch.full((4, 256, 256, 3), k, dtype=torch.uint8), "index": torch.tensor([k])} for k in range(24)]
    it = PinnedStager(iter(src), DEV, slots=2, to_device=("img",))
    copies = []
    for k in range(len(src)):
        batch = next(it)
        assert batch["img"].device == DEV and batch["index"].device.type == "cpu" and batch["index"].is_pinned()
        assert int(batch["index"]) == k
        torch.cuda._sleep(20_000_000)  # the step that reads the batch runs late
        copies.append(batch["img"].clone())  # read on the caller's stream, after the sleep
    torch.cuda.synchronize()
    assert all(bool((t == k).all()) for k, t in enumerate(copies))


def test_the_loader_uploads_what_the_step_reads_and_leaves_the_rest_on_the_host(tiny_data):
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset
    from libreyolo.data.labels import scan_labels
    from libreyolo.data.loader import STEP_KEYS, release_workers, train_loader

    dc = load_data_config(str(tiny_data))
    ds = YOLODataset(scan_labels(list_images(dc.train), dc.nc), 64, augment=False)
    dl = train_loader(ds, 4, 0, seed=0, pin=True, device=DEV)
    try:
        batch = next(iter(dl))
        assert all(batch[k].device == DEV for k in STEP_KEYS)
        assert batch["index"].device.type == "cpu"
        assert batch["img"].shape == (4, 64, 64, 3)
    finally:
        release_workers(dl)
