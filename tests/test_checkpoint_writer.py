"""Checkpoints are written on a background thread: what lands is what training had when it asked, events
come once the file is in place, and a failed write still fails the run."""

import os
import subprocess
import sys
import threading

import pytest
import torch

from libreyolo.engine import checkpoint
from libreyolo.engine.checkpoint import CheckpointWriter
from libreyolo.engine.snapshot import snapshot
from libreyolo.errors import CheckpointError


def test_a_snapshot_written_later_holds_the_values_at_save_time(tmp_path, monkeypatch):
    gate = threading.Event()
    real_save = checkpoint.save_atomic

    def slow_save(obj, path):
        gate.wait(10)  # the disk is slow: training goes on meanwhile
        return real_save(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_save)
    w = torch.ones(4)
    state = {"opt": {"exp_avg": torch.zeros(4)}, "steps": [torch.tensor(1)]}
    done = []
    writer = CheckpointWriter()
    writer.submit(snapshot({"w": w, "state": state}), tmp_path / "last.pt", done.append)
    w.add_(5)  # the optimizer steps in place before the write happens
    state["opt"]["exp_avg"].add_(1)
    writer.drain()
    assert done == []  # not written yet: no event claims it is
    gate.set()
    writer.close()
    assert done == [tmp_path / "last.pt"]
    got = torch.load(tmp_path / "last.pt", weights_only=True)
    assert got["w"].tolist() == [1.0] * 4 and got["state"]["opt"]["exp_avg"].tolist() == [0.0] * 4
    assert isinstance(got["state"]["steps"], list) and got["state"]["steps"][0].item() == 1


def test_writes_land_in_order_and_an_error_surfaces_in_the_training_thread(tmp_path, monkeypatch):
    order = []
    real_save = checkpoint.save_atomic

    def recording_save(obj, path):
        if obj.get("fail"):
            raise OSError(28, "No space left on device")
        order.append(obj["n"])
        return real_save(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", recording_save)
    writer = CheckpointWriter()
    for n in range(5):
        writer.submit({"n": n}, tmp_path / "last.pt", lambda p: None)
    writer.drain(wait=True)
    assert order == [0, 1, 2, 3, 4] and torch.load(tmp_path / "last.pt", weights_only=True)["n"] == 4
    writer.submit({"fail": True}, tmp_path / "last.pt", lambda p: None)
    with pytest.raises(OSError, match="No space left"):
        writer.close()


def test_a_run_whose_checkpoint_cannot_be_written_fails_with_that_error(tiny_data, tmp_path, monkeypatch):
    from conftest import FAST

    from libreyolo import LibreYOLO
    from libreyolo.events import read_events

    real_save = checkpoint.save_atomic

    def full_disk_for_best(obj, path):
        if path.name == "best.pt":
            raise OSError(28, f"No space left on device: {path}")
        return real_save(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", full_disk_for_best)
    with pytest.raises(OSError, match="best.pt"):
        LibreYOLO("LibreYOLO9t").train(**{**FAST, "data": str(tiny_data), "project": str(tmp_path), "epochs": 1})
    events = list(read_events(tmp_path / "exp" / "events.jsonl"))
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "failed"
    assert any(e["type"] == "error" and "No space left" in e["message"] for e in events)
    assert (tmp_path / "exp" / "weights" / "last.pt").is_file()  # the writes before the failure landed


def test_a_snapshot_resolves_to_the_same_record_with_separate_contiguous_cpu_tensors():
    conv = torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last)
    record = {
        "model": {"w": conv, "b": torch.arange(4.0), "n": torch.tensor(7), "empty": torch.zeros(0, 2)},
        "half": [torch.ones(2, 2, dtype=torch.float16), (torch.tensor(True), 3)],
        "view": torch.arange(10.0)[2:8:2],
        "meta": {"epoch": 3, "name": "x"},
        "param": torch.nn.Parameter(torch.ones(3)),  # a tensor that requires grad is copied as plain data
    }
    w0 = conv.clone()
    snap = snapshot(record)
    conv.add_(1)  # training goes on: the snapshot keeps the values it was taken with
    got = snap.resolve()
    for a, b in [
        (got["model"]["w"], w0),
        (got["model"]["b"], torch.arange(4.0)),
        (got["model"]["n"], torch.tensor(7)),
        (got["half"][0], torch.ones(2, 2, dtype=torch.float16)),
        (got["view"], torch.tensor([2.0, 4.0, 6.0])),
    ]:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert got["model"]["empty"].shape == (0, 2) and got["half"][1][1] == 3 and isinstance(got["half"][1], tuple)
    assert got["meta"] == {"epoch": 3, "name": "x"}
    assert torch.equal(got["param"], torch.ones(3)) and not got["param"].requires_grad
    tensors = [got["model"]["w"], got["model"]["b"], got["view"], got["half"][0], got["param"]]
    assert all(t.is_contiguous() and t.device.type == "cpu" for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)  # no shared storage


def test_a_packed_train_state_loads_back_as_the_plain_one(tmp_path):
    from libreyolo.engine.checkpoint import FORMAT, load_checkpoint, save_atomic

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    train = {"net": net.state_dict(), "optimizer": opt.state_dict(), "rng": {"torch": torch.get_rng_state()}, "n": 3}
    record = {"format": FORMAT, "model": net.state_dict(), "train": snapshot(train, packed=True)}
    save_atomic(snapshot(record).resolve(), tmp_path / "last.pt")
    raw = torch.load(tmp_path / "last.pt", weights_only=True)
    assert raw["train"]["packed"] and len(raw["train"]["buffers"]) == 3  # float32, int64 (BN count), uint8 (rng)
    got = load_checkpoint(tmp_path / "last.pt")["train"]
    assert got["n"] == 3 and torch.equal(got["rng"]["torch"], train["rng"]["torch"])
    assert got["net"].keys() == train["net"].keys()
    assert all(torch.equal(got["net"][k], v) for k, v in train["net"].items())
    assert got["optimizer"]["param_groups"] == train["optimizer"]["param_groups"]
    for i, state in train["optimizer"]["state"].items():
        assert all(torch.equal(got["optimizer"]["state"][i][k], v) for k, v in state.items())
    fresh = torch.optim.AdamW(net.parameters())
    fresh.load_state_dict(got["optimizer"])  # what resume does with it

    raw["train"]["buffers"] = raw["train"]["buffers"][:1]  # a damaged file: a buffer is missing
    torch.save(raw, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="bad.pt is corrupt: its train state does not unpack"):
        load_checkpoint(tmp_path / "bad.pt")


def test_a_large_record_is_packed_in_bounded_buffers_and_a_full_device_falls_back(monkeypatch):
    from libreyolo.engine import snapshot as snap_mod

    monkeypatch.setattr(snap_mod, "CHUNK_BYTES", 64)  # 16 float32 values per buffer
    record = {"a": torch.arange(10.0), "b": torch.arange(10.0) + 10, "c": torch.arange(40.0).view(4, 10)}
    record["d"] = torch.ones(3)
    packed = snapshot(record, packed=True).resolve()
    assert [b.numel() for b in packed["buffers"]] == [10, 10, 40, 3]  # c alone exceeds the limit: a buffer of its own
    assert all(torch.equal(v, record[k]) for k, v in snap_mod.unpack(packed).items())

    real_cat, calls = torch.cat, []

    def cat_without_room(tensors, *a, **k):
        calls.append(len(tensors))
        if len(calls) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_cat(tensors, *a, **k)

    monkeypatch.setattr(torch, "cat", cat_without_room)
    got = snapshot(record).resolve()
    assert all(torch.equal(v, record[k]) for k, v in got.items()) and calls[:2] == [1, 1]  # packing failed, then copies


def test_an_enabled_scaler_is_saved_without_reading_it_and_restores_to_its_own_state(tmp_path):
    """last.pt keeps an enabled GradScaler's scale and growth tracker as tensors (GradScaler.state_dict() reads
    both off the device, a wait for every queued step); resume turns them back into torch's own state dict."""
    from libreyolo.engine.checkpoint import FORMAT, load_checkpoint, save_atomic
    from libreyolo.engine.state import restore_train_state, scaler_state

    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    for k in range(4):  # a skipped step, then two good ones: scale 512, growth tracker 2
        scaler.scale(p.sum()).backward()
        if k == 1:
            p.grad.fill_(float("inf"))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    state = scaler_state(scaler)
    assert isinstance(state["scale"], torch.Tensor) and isinstance(state["_growth_tracker"], torch.Tensor)
    train = {"net": {}, "optimizer": opt.state_dict(), "scaler": state, "ema": None}
    save_atomic(snapshot({"format": FORMAT, "train": snapshot(train, packed=True)}).resolve(), tmp_path / "last.pt")
    fresh = torch.amp.GradScaler("cpu")
    restore_train_state(load_checkpoint(tmp_path / "last.pt"), torch.nn.Module(), opt, fresh, None)
    assert fresh.state_dict() == scaler.state_dict()
    assert fresh.get_scale() == 512.0 and fresh.state_dict()["_growth_tracker"] == 2


def test_unfinished_checkpoint_files_of_a_dead_writer_are_removed_and_a_live_writers_kept(tmp_path):
    """save_atomic writes .NAME.PID.tmp and renames it; a kill -9 mid-write leaves it behind. A new run in that
    folder removes those whose writer is gone, and nothing else."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "last.pt").write_bytes(b"checkpoint")
        names = {
            f".best.pt.{gone.pid}.tmp": False,  # its writer is gone: removed
            f".last.pt.{alive.pid}.tmp": True,  # another process is writing it now
            f".last.pt.{os.getpid()}.tmp": True,  # this process's own
            ".notes.tmp": True,  # not save_atomic's
        }
        for name in names:
            (tmp_path / name).write_bytes(b"half")
        removed = checkpoint.remove_stale_temporaries(tmp_path)
        assert removed == [f".best.pt.{gone.pid}.tmp"]
        assert {n for n, kept in names.items() if kept} | {"last.pt"} == {p.name for p in tmp_path.iterdir()}
    finally:
        alive.kill()
        alive.wait()
