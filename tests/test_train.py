"""End-to-end training on CPU: over-fitting, resume, kill -9, the event stream, results.csv."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import FAST, NO_AUG

from libreyolo import LibreYOLO
from libreyolo.engine import saver as saver_mod
from libreyolo.engine import trainer as trainer_mod
from libreyolo.engine.checkpoint import load_checkpoint, save_atomic
from libreyolo.events import read_events, validate_event


def test_tiny_model_overfits_a_handful_of_images(overfit_data, tmp_path):
    # 80 epochs: seeds 0 and 3 reached mAP50 0.97-1.0 on AVX-512 and on AVX2 alone, whose float32 kernels round
    # differently; after 50 epochs they stood at 0.64-0.92, depending on the trajectory
    m = LibreYOLO("LibreYOLO9t")
    metrics = m.train(
        data=str(overfit_data),
        epochs=80,
        imgsz=64,
        batch=8,
        nbs=8,
        workers=0,
        device="cpu",
        warmup_epochs=0,
        **NO_AUG,
        optimizer="AdamW",
        lr0=0.004,
        val=False,
        project=str(tmp_path),
        seed=0,
    )
    rows = list(csv.DictReader(open(m.last_run / "results.csv")))
    assert len(rows) == 1  # val=false validates only the last epoch (BatchNorm needs ~150 steps to settle)
    ev = [e for e in read_events(m.last_run / "events.jsonl") if e["type"] == "epoch_end"]
    # the first epoch's loss is low only because almost no anchor is assigned yet (box ~0.07): compare
    # with the early peak, once assignment works
    total = [7.5 * e["losses"]["box"] + 0.5 * e["losses"]["cls"] + 1.5 * e["losses"]["dfl"] for e in ev]
    cls = [e["losses"]["cls"] for e in ev]
    assert total[-1] < 0.5 * max(total[:5]) and cls[-1] < max(cls[:5]) / 4
    assert metrics["map50"] > 0.8, metrics
    # the facade now holds the trained weights and predicts the memorised shapes
    res = m.predict(sorted((overfit_data.parent / "images" / "train").glob("*.jpg"))[:2], device="cpu")
    assert all(len(r) >= 1 for r in res)


def _train(data, tmp_path, **kw):
    m = LibreYOLO("LibreYOLO9t")
    args = {**FAST, "data": str(data), "project": str(tmp_path), "no_aug_epochs": 1, **kw}
    return m, m.train(**args)


def test_run_folder_events_and_results_csv(tiny_data, tmp_path):
    seen = []
    m, _ = _train(tiny_data, tmp_path, epochs=2, callbacks=[seen.append])
    run = m.last_run
    assert run.name == "exp" and (run / "args.yaml").is_file()
    assert (run / "weights" / "last.pt").is_file() and (run / "weights" / "best.pt").is_file()
    events = list(read_events(run / "events.jsonl"))
    for e in events:
        validate_event(e)
    types = [e["type"] for e in events]
    assert types[0] == "run_start" and types[-1] == "run_end" and events[-1]["status"] == "finished"
    for t in ("epoch_start", "step", "val", "epoch_end", "checkpoint", "amp"):
        assert t in types, t
    assert [e.type for e in seen] == types  # callbacks get exactly what the file gets
    with open(run / "results.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == [  # the Ultralytics layout, built from YOLOv9's loss terms and three parameter groups
        "epoch",
        "time",
        "train/box_loss",
        "train/cls_loss",
        "train/dfl_loss",
        "metrics/precision(B)",
        "metrics/recall(B)",
        "metrics/mAP50(B)",
        "metrics/mAP50-95(B)",
        "val/box_loss",
        "val/cls_loss",
        "val/dfl_loss",
        "lr/pg0",
        "lr/pg1",
        "lr/pg2",
    ]
    assert [r[0] for r in rows[1:]] == ["1", "2"]
    # a second run does not overwrite the first
    m2, _ = _train(tiny_data, tmp_path, epochs=1)
    assert m2.last_run.name == "exp2"
    ck = load_checkpoint(run / "weights" / "best.pt")
    assert "train" not in ck and ck["names"] == ["circle", "square", "triangle"]


class _StopAfterEpoch:
    """Module-level so it is an ordinary callback: raises Ctrl-C once epoch `n` has ended."""

    def __init__(self, n):
        self.n = n

    def __call__(self, e):
        if e.type == "epoch_end" and e.epoch == self.n:
            raise KeyboardInterrupt


@pytest.mark.parametrize("workers", [0, 2])  # with workers the next epoch is opened (prefetched) before the stop
def test_resume_reproduces_the_uninterrupted_run(tiny_data, tmp_path, workers):
    full, _ = _train(tiny_data, tmp_path / "a", epochs=2, workers=workers)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_data, tmp_path / "b", epochs=2, workers=workers, callbacks=[_StopAfterEpoch(0)])
    last = tmp_path / "b" / "exp" / "weights" / "last.pt"
    ck = load_checkpoint(last)
    assert (ck["epoch"], ck["step"]) == (1, 0)
    ends = [e for e in read_events(last.parent.parent / "events.jsonl") if e["type"] == "run_end"]
    assert ends[-1]["status"] == "interrupted"
    resumed = LibreYOLO(last)
    resumed.train(resume=True, model=str(last))
    a = load_checkpoint(tmp_path / "a" / "exp" / "weights" / "last.pt")
    b = load_checkpoint(last)
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0, msg=k)
    rows_a = list(csv.DictReader(open(tmp_path / "a" / "exp" / "results.csv")))
    rows_b = list(csv.DictReader(open(tmp_path / "b" / "exp" / "results.csv")))
    assert rows_a[1]["train/box_loss"] == rows_b[1]["train/box_loss"]
    assert rows_a[1]["metrics/mAP50(B)"] == rows_b[1]["metrics/mAP50(B)"]


def test_kill_9_mid_epoch_leaves_a_loadable_resumable_last_pt(tiny_data, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "libreyolo.cli.main",
        "train",
        f"data={tiny_data}",
        "epochs=6",
        "imgsz=64",
        "batch=4",
        "workers=0",
        "device=cpu",
        f"project={tmp_path}",
        "log_interval=0.05",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    events = tmp_path / "exp" / "events.jsonl"
    weights = tmp_path / "exp" / "weights"
    deadline = time.time() + 120
    idle = 0  # consecutive polls that found no checkpoint being written
    try:
        while time.time() < deadline:
            seen = list(read_events(events)) if events.exists() else []
            # mid-epoch 2, once epoch 1's last.pt has landed (its writer thread may still be busy after the
            # epoch's first steps on a loaded machine; the checkpoint event is emitted when the file is in place)
            # and no write is in flight: a kill during one (best.pt follows last.pt) leaves its temporary file
            # beside the checkpoints (the next run in the folder removes it: planted and checked below)
            idle = 0 if list(weights.glob(".*.tmp")) else idle + 1
            if (
                any(e["type"] == "checkpoint" and e["kind"] == "last" and e["epoch"] >= 1 for e in seen)
                and any(e["type"] == "step" and e["epoch"] >= 1 and e["step"] >= 2 for e in seen)
                and idle >= 3
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run never reached epoch 2 with epoch 1's last.pt written and no write in flight")
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    last = tmp_path / "exp" / "weights" / "last.pt"
    ck = load_checkpoint(last)
    assert ck["epoch"] >= 1 and "train" in ck
    assert not list(last.parent.glob(".*.tmp"))  # no temp file left behind as a "checkpoint"
    assert LibreYOLO(last).trained
    # what a kill during a write leaves (the writer's pid in its name): the resumed run removes it, and says so
    stale = last.parent / f".best.pt.{p.pid}.tmp"
    stale.write_bytes(b"half a checkpoint")
    r = subprocess.run(
        [sys.executable, "-m", "libreyolo.cli.main", "train", f"resume={last}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_ends = [e for e in read_events(events) if e["type"] == "run_end"]
    assert [e["status"] for e in run_ends] == ["finished"]  # the killed process never wrote one
    assert load_checkpoint(last)["epoch"] == 6
    assert not stale.exists()
    assert any(e["type"] == "warning" and stale.name in e["message"] for e in read_events(events))


def test_sigint_stops_a_run_started_with_sigint_ignored(tiny_data, tmp_path):
    """A background job of a non-interactive shell starts with SIGINT ignored; `kill -INT` (and the console's Stop,
    which sends SIGINT first) must still save last.pt and end the run `interrupted`."""
    cmd = [
        sys.executable,
        "-m",
        "libreyolo.cli.main",
        "train",
        f"data={tiny_data}",
        "epochs=50",
        "imgsz=64",
        "batch=4",
        "workers=0",
        "device=cpu",
        f"project={tmp_path}",
        "log_interval=0.05",
        "val=false",
    ]
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    events = tmp_path / "exp" / "events.jsonl"
    try:
        deadline = time.time() + 120
        while not (events.exists() and any(e["type"] == "step" for e in read_events(events))):
            assert time.time() < deadline and p.poll() is None, "the run never reached its first step"
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-3000:]
    assert [e["status"] for e in read_events(events) if e["type"] == "run_end"] == ["interrupted"]
    assert load_checkpoint(tmp_path / "exp" / "weights" / "last.pt")["epoch"] < 50


def test_loader_workers_are_gone_when_train_returns(tiny_data, tmp_path):
    """Persistent workers left to interpreter exit cost 5 s each there (torch's atexit join timeout)."""
    import psutil

    from libreyolo.config import TrainConfig
    from libreyolo.engine.trainer import Trainer

    kw = {**FAST, "data": str(tiny_data), "project": str(tmp_path), "epochs": 1, "workers": 2}
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. multiprocessing's resource tracker
    trainer = Trainer(LibreYOLO("LibreYOLO9t"), TrainConfig.from_overrides(kw))
    trainer.train()
    # the trainer (and its loader) is still referenced here, as a reference cycle would keep it
    assert trainer.s.train_loader is not None
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def _log_requested_epochs(monkeypatch, log):
    """Every training sample the loader workers make appends its epoch to `log` (a file: workers are processes)."""
    from libreyolo.data.dataset import YOLODataset

    log.touch()
    real_getitem = YOLODataset.__getitem__

    def logging_getitem(self, key):
        if isinstance(key, tuple):
            with open(log, "a") as f:
                f.write(f"{key[1]}\n")
        return real_getitem(self, key)

    monkeypatch.setattr(YOLODataset, "__getitem__", logging_getitem)


def _wait_for(log, done, timeout=10.0):
    """The epochs logged once done(epochs) holds, or after timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline and not done(set(log.read_text().split())):
        time.sleep(0.05)
    return set(log.read_text().split())


def test_train_workers_decode_the_next_epoch_before_the_last_one_ends(tiny_data, tmp_path, monkeypatch):
    """One loader pass spans the run's epochs: the workers take the next epoch's batches as soon as the queue has
    room, so they are decoded while this epoch's last steps run and while it validates and checkpoints, and
    the next epoch's first step does not wait for a cold queue (the race lost 0.03-0.4 s per epoch to that)."""
    from libreyolo.engine.trainer import Trainer

    log = tmp_path / "requested.txt"
    _log_requested_epochs(monkeypatch, log)
    real_train_epoch = Trainer._train_epoch
    seen_at_epoch_end = []

    def watching_train_epoch(self, epoch, it):
        real_train_epoch(self, epoch, it)  # the epoch's steps are done; nothing has been opened for the next one
        seen_at_epoch_end.append(_wait_for(log, lambda seen: epoch == 2 or str(epoch + 1) in seen))

    monkeypatch.setattr(Trainer, "_train_epoch", watching_train_epoch)
    _train(tiny_data, tmp_path, epochs=3, workers=2)
    assert "1" in seen_at_epoch_end[0] and "2" in seen_at_epoch_end[1]


def test_the_first_batches_are_decoded_while_the_network_is_built(tiny_data, tmp_path, monkeypatch):
    """The setup opens the first loader pass as soon as the loaders exist, so the run's first step does not wait
    for workers that started only after everything else was built (on the H200: fork 0.2 s + first batch 0.5 s)."""
    from libreyolo.engine import builders

    log = tmp_path / "requested.txt"
    _log_requested_epochs(monkeypatch, log)
    real_parts = builders.build_step_parts
    seen_while_building = []

    def watching_parts(*args, **kwargs):
        seen_while_building.append(_wait_for(log, bool))
        return real_parts(*args, **kwargs)

    monkeypatch.setattr(builders, "build_step_parts", watching_parts)
    _train(tiny_data, tmp_path, epochs=1, workers=2)
    assert seen_while_building == [{"0"}]


def test_a_setup_that_fails_after_the_loader_started_leaves_no_worker(tiny_data, tmp_path, monkeypatch):
    import psutil

    from libreyolo.engine import builders

    def broken_parts(*args, **kwargs):
        raise RuntimeError("building the step failed")

    monkeypatch.setattr(builders, "build_step_parts", broken_parts)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="building the step failed") as failed:
        _train(tiny_data, tmp_path, epochs=1, workers=2)
    # the traceback (held here, as by a caller that logs it) keeps the setup's frame and its loader alive
    assert failed.traceback
    deadline = time.time() + 10
    while time.time() < deadline and [p for p in psutil.Process().children(recursive=True) if p.pid not in before]:
        time.sleep(0.1)
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def test_cudnn_benchmark_auto_times_algorithms_only_for_long_runs(tiny_data, tmp_path, monkeypatch):
    from libreyolo.engine.state import CUDNN_BENCHMARK_MIN_STEPS, cudnn_benchmark_for

    assert not cudnn_benchmark_for("auto", False, CUDNN_BENCHMARK_MIN_STEPS - 1)
    assert cudnn_benchmark_for("auto", False, CUDNN_BENCHMARK_MIN_STEPS)
    assert cudnn_benchmark_for(True, False, 1) and not cudnn_benchmark_for(False, False, 10**9)
    assert not cudnn_benchmark_for(True, True, 10**9)  # deterministic wins
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    _train(tiny_data, tmp_path / "on", epochs=1, cudnn_benchmark=True)
    assert torch.backends.cudnn.benchmark is True
    _train(tiny_data, tmp_path / "auto", epochs=1)  # a handful of steps: not worth the timing
    assert torch.backends.cudnn.benchmark is False


def _planted_evaluations(monkeypatch, maps: list[float], seconds: float) -> list[dict]:
    """COCO evaluations that take `seconds` (so they land while the next epoch trains) and return planted mAPs;
    -> the EMA weights each validation started from, in order."""
    from conftest import patch_task

    from libreyolo.eval.coco import CocoAccumulator
    from libreyolo.eval.validator import start_validation as real_start

    planted, started = list(maps), []

    def evaluate(self, workers=1, process=None):
        time.sleep(seconds)
        m = planted.pop(0)
        return {"map50": m, "map": m, "precision": m, "recall": m}

    def start(net, *args, **kwargs):
        started.append({k: v.detach().clone() for k, v in net.state_dict().items()})
        return real_start(net, *args, **kwargs)

    monkeypatch.setattr(CocoAccumulator, "evaluate", evaluate)
    patch_task(monkeypatch, "detect", start_validation=start)
    return started


def test_background_evaluation_lands_during_the_next_epoch_and_best_pt_follows_it(tiny_data, tmp_path, monkeypatch):
    started = _planted_evaluations(monkeypatch, [0.2, 0.5, 0.3], seconds=1.0)
    packed: list[str] = []  # which save took a snapshot: best.pt reuses its epoch's last.pt snapshot instead
    real_save, real_snapshot = trainer_mod.Trainer.save, saver_mod.snapshot
    saving: list[str] = []

    def save(self, which, *a, **k):
        saving.append(which)
        try:
            return real_save(self, which, *a, **k)
        finally:
            saving.pop()

    monkeypatch.setattr(trainer_mod.Trainer, "save", save)
    monkeypatch.setattr(saver_mod, "snapshot", lambda *a, **k: (packed.append(saving[-1]), real_snapshot(*a, **k))[1])
    m, _ = _train(tiny_data, tmp_path, epochs=3)
    assert "best" not in packed and packed.count("last") == 2 * 4  # the first last.pt and one per epoch: model, train
    events = list(read_events(m.last_run / "events.jsonl"))
    order = [(e["type"], e.get("epoch"), e.get("kind")) for e in events]
    # epoch 1 had started (training on) before epoch 0's evaluation landed; every evaluation landed before run_end
    assert order.index(("epoch_start", 1, None)) < order.index(("val", 0, None))
    vals = [e for e in events if e["type"] == "val"]
    assert [v["epoch"] for v in vals] == [0, 1, 2] and [v["map"] for v in vals] == [0.2, 0.5, 0.3]
    assert all(v["eval_s"] >= 1.0 and v["time_s"] < v["eval_s"] + 60 for v in vals)
    assert order.index(("val", 2, None)) < order.index(("run_end", None, None))
    # best.pt: saved when epoch 1's evaluation landed (after it), from the weights epoch 1 validated, not later ones
    bests = [i for i, o in enumerate(order) if o[0] == "checkpoint" and o[2] == "best"]
    assert order.index(("val", 1, None)) < bests[-1]
    best = load_checkpoint(m.last_run / "weights" / "best.pt")
    assert best["epoch"] == 2 and best["metrics"]["map"] == 0.5 and best["best_fitness"] == pytest.approx(0.5)
    for k, v in started[1].items():
        torch.testing.assert_close(best["model"][k], v.cpu(), rtol=0, atol=0, msg=k)
    assert any(not torch.equal(started[1][k], started[2][k]) for k in started[1])  # epoch 2 did change the weights
    with open(m.last_run / "results.csv") as f:
        assert [r["metrics/mAP50-95(B)"] for r in csv.DictReader(f)] == ["0.2", "0.5", "0.3"]


class _CrashAfterBest:
    """Module-level so it is an ordinary callback: fails the run once best.pt for epoch `n` is in place."""

    def __init__(self, n):
        self.n = n

    def __call__(self, e):
        if e.type == "checkpoint" and e.kind == "best" and e.epoch == self.n:
            raise RuntimeError("crash after best.pt")


def test_resume_keeps_a_best_pt_that_landed_after_last_pt(tiny_data, tmp_path, monkeypatch):
    """An epoch's validation lands after that epoch's last.pt was written (during the next epoch), so a crash can
    leave a best.pt better than the best_fitness last.pt recorded. Resuming must not overwrite it with a worse
    epoch."""
    _planted_evaluations(monkeypatch, [0.2, 0.9] + [0.3] * 4, seconds=0.05)
    with pytest.raises(RuntimeError, match="crash after best"):
        _train(tiny_data, tmp_path, epochs=4, callbacks=[_CrashAfterBest(2)])
    weights = tmp_path / "exp" / "weights"
    last, best = load_checkpoint(weights / "last.pt"), load_checkpoint(weights / "best.pt")
    assert best["best_fitness"] == pytest.approx(0.9)
    assert last["best_fitness"] in (pytest.approx(0.2), pytest.approx(0.9))
    # the order this test is about, whatever the machine's timing gave: last.pt written before epoch 2's evaluation
    # landed, so it records the best fitness before it (on a fast machine the evaluation can land first)
    last["best_fitness"] = 0.2
    save_atomic(last, weights / "last.pt")
    LibreYOLO(weights / "last.pt").train(resume=True, model=str(weights / "last.pt"))
    best = load_checkpoint(weights / "best.pt")
    assert best["epoch"] == 2 and best["best_fitness"] == pytest.approx(0.9)


def test_early_stopping_takes_effect_when_the_evaluation_lands(tiny_data, tmp_path, monkeypatch):
    _planted_evaluations(monkeypatch, [0.5, 0.2, 0.9, 0.9], seconds=0.5)
    m, _ = _train(tiny_data, tmp_path, epochs=4, patience=1)
    events = list(read_events(m.last_run / "events.jsonl"))
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "early_stop"
    assert [e["epoch"] for e in events if e["type"] == "val"] == [0, 1]  # epoch 1 was not better: no epoch 2 validation
    assert [e["code"] for e in events if e["type"] == "warning"] == ["patience"]
    assert load_checkpoint(m.last_run / "weights" / "best.pt")["metrics"]["map"] == 0.5
