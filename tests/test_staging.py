"""Staging training batches through a few fixed buffers (data/staging.py), and the training loader that uses it."""

import threading
import time

import pytest
import torch
from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo.data import loader as loader_mod
from libreyolo.data.loader import release_workers
from libreyolo.data.staging import PinnedStager
from libreyolo.engine.checkpoint import load_checkpoint


def _batches(n: int, boxes: int = 2) -> list[dict]:
    return [
        {
            "img": torch.full((2, 8, 8, 3), k, dtype=torch.uint8),
            "targets": torch.full((2, boxes, 5), float(k)),
            "mask": torch.ones(2, boxes, dtype=torch.bool),
            "bad": [f"bad{k}"],
        }
        for k in range(n)
    ]


def _stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "libreyolo-stage"]


def test_batches_come_out_as_they_went_in_then_the_thread_ends():
    src = _batches(7)
    it = PinnedStager(iter(src), None)
    for want in src:
        got = next(it)
        assert got["bad"] == want["bad"]
        for k in ("img", "targets", "mask"):
            assert got[k] is not want[k] and got[k].dtype == want[k].dtype
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert it._thread is None


def test_a_held_batch_is_not_overwritten_and_the_buffers_are_reused():
    """The thread runs ahead while the caller holds a batch; the stager's few slots serve the whole pass."""
    src = _batches(12)
    it = PinnedStager(iter(src), None, slots=3)
    ptrs = set()
    for k in range(12):
        got = next(it)
        time.sleep(0.01)  # the thread stages the next batches meanwhile
        assert int(got["img"].flatten()[0]) == k and float(got["targets"].flatten()[-1]) == k
        ptrs.add(got["img"].data_ptr())
    assert len(ptrs) == 3
    it.close()


def test_close_ends_a_thread_that_waits_for_a_slot():
    it = PinnedStager(iter(_batches(10)), None, slots=2)
    next(it)
    time.sleep(0.05)  # the thread has filled the other slot and waits for one
    thread = it._thread
    assert thread is not None and thread.is_alive()
    it.close()
    assert not thread.is_alive()
    with pytest.raises(StopIteration):
        next(it)


def test_a_larger_batch_grows_its_slot():
    src = _batches(3, boxes=2) + _batches(3, boxes=64)
    got = [next(it)["targets"].clone() for it in [PinnedStager(iter(src), None)] for _ in range(6)]
    assert [tuple(t.shape) for t in got] == [(2, 2, 5)] * 3 + [(2, 64, 5)] * 3
    assert [float(t.flatten()[0]) for t in got] == [0, 1, 2, 0, 1, 2]


def test_a_source_error_comes_after_the_batches_before_it():
    def source():
        yield from _batches(2)
        raise RuntimeError("worker 3 died")

    it = PinnedStager(source(), None)
    assert int(next(it)["img"][0, 0, 0, 0]) == 0
    assert int(next(it)["img"][0, 0, 0, 0]) == 1
    with pytest.raises(RuntimeError, match="worker 3 died"):
        next(it)
    assert it._thread is None


def test_the_train_loader_ends_a_pass_s_thread_at_the_next_pass_and_at_release(tiny_data):
    from libreyolo.data.config import list_images, load_data_config
    from libreyolo.data.dataset import YOLODataset
    from libreyolo.data.labels import scan_labels

    dc = load_data_config(str(tiny_data))
    ds = YOLODataset(scan_labels(list_images(dc.train), dc.nc), 64, augment=False)
    dl = loader_mod.train_loader(ds, 2, 0, seed=0, pin=False)
    assert dl.stage_to is None and not isinstance(iter(dl), PinnedStager)  # CPU: nothing to page-lock
    dl.stage_to = torch.device("cpu")  # staged into ordinary memory: the path a CUDA run takes
    first = iter(dl)
    assert isinstance(first, PinnedStager)
    next(first)
    # Each pass's own thread, by identity: another test's stager thread may still be ending meanwhile.
    t1 = first._thread
    assert t1 is not None and t1.is_alive() and t1 in _stage_threads()
    second = iter(dl)  # the next pass: the first one's thread has ended
    next(second)
    t2 = second._thread
    assert first._thread is None and not t1.is_alive()
    assert t2 is not None and t2 is not t1 and t2.is_alive()
    release_workers(dl)
    assert second._thread is None and not t2.is_alive()


def test_a_run_with_staged_batches_trains_exactly_as_one_without(tiny_data, tmp_path, monkeypatch):
    def run(name: str) -> dict[str, torch.Tensor]:
        m = LibreYOLO("LibreYOLO9t")
        m.train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "name": name, "epochs": 2, "seed": 1})
        return load_checkpoint(tmp_path / name / "weights" / "last.pt")["model"]

    plain = run("plain")
    made = []
    orig_init = loader_mod.TrainLoader.__init__

    def staged(self, *a, **kw):
        orig_init(self, *a, **kw)
        self.stage_to = torch.device("cpu")
        made.append(self)

    monkeypatch.setattr(loader_mod.TrainLoader, "__init__", staged)
    staged_weights = run("staged")
    assert len(made) == 1 and made[0]._stager is None  # released at the run's end
    for k in plain:
        torch.testing.assert_close(staged_weights[k], plain[k], rtol=0, atol=0, msg=k)
