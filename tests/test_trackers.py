"""Experiment trackers (issue 54): mlflow=true logs params, both epochs' metrics and the run's files to a file store
read back through MlflowClient; wandb=true keeps an offline run where there is no network; a backend that raises
or hangs never fails or holds the run; a missing package is a clear error before the run starts."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import FAST

from libreyolo import LibreYOLO, trackers
from libreyolo.cli.main import main
from libreyolo.errors import ConfigError
from libreyolo.events import read_events
from libreyolo.trackers import base

TWO_EPOCHS = dict(FAST, epochs=2, no_aug_epochs=1, warmup_epochs=0)


def a_plot(e) -> None:
    """A user callback that leaves a picture in the run folder, as the run's plots do: the tracker uploads every
    .png and .jpg it finds there at the end."""
    if e.type == "run_start":
        img = np.zeros((32, 48, 3), np.uint8)
        img[8:24, 8:40] = 255
        cv2.imwrite(str(Path(e.run_dir) / "custom_plot.png"), img)


def test_mlflow_logs_params_both_epochs_metrics_and_the_artifacts(tiny_data, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason='mlflow is not installed: pip install "libreyolo[mlflow]"')
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # the default store is ./mlruns
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(tiny_data), project=str(tmp_path / "runs"), mlflow=True, callbacks=[a_plot], **TWO_EPOCHS)

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.get_experiment_by_name(str(tmp_path / "runs"))
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == m.last_run.name and run.info.status == "FINISHED"
    params = run.data.params
    assert params["epochs"] == "2" and params["imgsz"] == "64" and params["model"] == "LibreYOLO9t"
    assert params["data"] == str(tiny_data) and "callbacks" not in params

    events = list(read_events(m.last_run / "events.jsonl"))
    ends = [e for e in events if e["type"] == "epoch_end"]
    vals = [e for e in events if e["type"] == "val"]
    assert len(ends) == len(vals) == 2
    for term in m.family.loss_terms:  # each epoch's numbers, at step = epoch 1, 2, as events.jsonl has them
        got = [(h.step, h.value) for h in client.get_metric_history(run.info.run_id, f"train/{term}_loss")]
        assert got == [(e["epoch"] + 1, pytest.approx(e["losses"][term], rel=1e-6)) for e in ends]
    got = [(h.step, h.value) for h in client.get_metric_history(run.info.run_id, "metrics/mAP50-95B")]
    assert got == [(e["epoch"] + 1, pytest.approx(e["map"], rel=1e-6, abs=1e-9)) for e in vals]
    assert {"lr/pg0", "val/box_loss", "metrics/mAP50B", "speed/epoch_s"} <= set(run.data.metrics)

    def files(folder=None):
        for a in client.list_artifacts(run.info.run_id, folder):
            yield from files(a.path) if a.is_dir else [a.path]

    arts = set(files())
    assert {"weights/best.pt", "results.csv", "args.yaml", "plots/custom_plot.png"} <= arts
    run_pngs = {f"plots/{p.name}" for p in m.last_run.glob("*.png")}
    assert run_pngs <= arts  # whatever plots the run wrote
    local = Path(client.download_artifacts(run.info.run_id, "weights/best.pt", str(tmp_path / "dl")))
    assert local.read_bytes() == (m.last_run / "weights" / "best.pt").read_bytes()


class _StopAtEpoch:
    """Ctrl-C as the second epoch starts (module level: an ordinary callback)."""

    def __call__(self, e):
        if e.type == "epoch_start" and e.epoch == 1:
            raise KeyboardInterrupt


def test_a_resumed_run_goes_on_in_the_same_mlflow_run(tiny_data, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason='mlflow is not installed: pip install "libreyolo[mlflow]"')
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    with pytest.raises(KeyboardInterrupt):
        LibreYOLO("LibreYOLO9t").train(
            data=str(tiny_data), project=str(tmp_path / "runs"), mlflow=True, callbacks=[_StopAtEpoch()], **TWO_EPOCHS
        )
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.get_experiment_by_name(str(tmp_path / "runs"))
    (first,) = client.search_runs([exp.experiment_id])
    assert first.info.status == "KILLED"
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    LibreYOLO(last).train(resume=True, model=str(last))

    (run,) = client.search_runs([exp.experiment_id])  # still one run: the resumed run logged into it
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "2"
    steps = [h.step for h in client.get_metric_history(run.info.run_id, "train/box_loss")]
    assert steps == [1, 2]
    events = list(read_events(tmp_path / "runs" / "exp" / "events.jsonl"))
    assert not [e for e in events if e["type"] == "warning" and e["code"] == "tracker"]


class Raising:
    name = "mlflow"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, run_dir, project, params, resumed):
        self.calls.append("start")

    def metrics(self, values, epoch):
        self.calls.append("metrics")
        raise ConnectionError("tracking server at http://10.0.0.9:5000 refused the connection")

    def artifacts(self, files):
        self.calls.append("artifacts")

    def finish(self, status):
        self.calls.append("finish")


class Hanging(Raising):
    name = "wandb"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def metrics(self, values, epoch):
        self.calls.append("metrics")
        self.release.wait(60)  # a server that never answers


def test_a_backend_that_raises_or_hangs_does_not_fail_or_hold_the_run(tiny_data, tmp_path, monkeypatch, capsys):
    raising, hanging = Raising(), Hanging()
    monkeypatch.setattr(trackers, "backend", lambda key: raising if key == "mlflow" else hanging)
    monkeypatch.setattr(trackers, "require", lambda cfg: None)  # the fakes need neither package
    monkeypatch.setattr(base, "CLOSE_TIMEOUT_S", 0.5)
    m = LibreYOLO("LibreYOLO9t")
    try:
        metrics = m.train(data=str(tiny_data), project=str(tmp_path), mlflow=True, wandb=True, **TWO_EPOCHS)
        hung = list(hanging.calls)
    finally:
        hanging.release.set()

    assert set(metrics) >= {"map50", "map"}
    events = list(read_events(m.last_run / "events.jsonl"))
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "finished"
    warned = [e["message"] for e in events if e["type"] == "warning" and e["code"] == "tracker"]
    assert len(warned) == 1  # one warning, however many calls would have failed
    assert warned[0].startswith("mlflow failed (ConnectionError: tracking server at http://10.0.0.9:5000 refused")
    assert raising.calls == ["start", "metrics"]  # nothing more was tried after the failure
    # the hanging one was still in its first call when the run ended: the run did not wait for it
    assert hung == ["start", "metrics"]
    assert "wandb: still sending after" in capsys.readouterr().err


def test_wandb_keeps_an_offline_run_without_a_network(tiny_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason='wandb is not installed: pip install "libreyolo[wandb]"')
    from libreyolo.trackers.wandb_backend import wandb_mode

    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no API key, so offline without trying the network
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    assert wandb_mode() == "offline"
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(tiny_data), project=str(tmp_path / "runs"), wandb=True, callbacks=[a_plot], **TWO_EPOCHS)

    (run,) = (m.last_run / "wandb").glob("offline-run-*")
    kept = {str(p.relative_to(run / "files")) for p in (run / "files").rglob("*") if p.is_file()}
    assert {"weights/best.pt", "results.csv", "args.yaml", "custom_plot.png"} <= kept
    assert (run / "files" / "weights" / "best.pt").read_bytes() == (m.last_run / "weights" / "best.pt").read_bytes()
    (log,) = run.glob("run-*.wandb")  # what `wandb sync` uploads: the metrics under their names
    data = log.read_bytes()
    assert all(k.encode() in data for k in ("train/box_loss", "metrics/mAP50-95B", "val/cls_loss", "epoch"))
    events = list(read_events(m.last_run / "events.jsonl"))
    assert not [e for e in events if e["type"] == "warning" and e["code"] == "tracker"]


def test_an_event_the_tracker_cannot_read_is_skipped_with_one_warning(tmp_path):
    from libreyolo import events as ev

    class Recording(Raising):
        def metrics(self, values, epoch):
            self.calls.append((epoch, values))

    rec, warned = Recording(), []
    t = base.Tracker(rec, tmp_path, "p", {"epochs": 2}, "detect", warned.append)
    val = ev.Val(
        epoch=0, losses={"box": 0.5}, images=8, time_s=0.1, eval_s=0.1, metrics={"precision": None, "map": 0.25}
    )
    bad = dict(losses={"box": 1.0}, lr=None, time_s=1.0, img_s=8.0, fitness=None, best_fitness=None, skipped_images=0)
    t(val)  # a metric the run could not compute (None) is left out, the others are logged
    t(ev.EpochEnd(epoch=0, **bad))  # lr=None: the tracker cannot read it; the training thread gets no exception
    t(ev.EpochEnd(epoch=1, **bad))  # skipped too, without a second warning
    t(ev.Val(epoch=1, losses={"box": 0.4}, images=8, time_s=0.1, eval_s=0.1, metrics={"map": 0.5}))
    t.close()
    assert rec.calls == [
        "start",
        (1, {"metrics/mAP50-95B": 0.25, "val/box_loss": 0.5}),
        (2, {"metrics/mAP50-95B": 0.5, "val/box_loss": 0.4}),
        "artifacts",
        "finish",
    ]
    assert len(warned) == 1 and warned[0].startswith("mlflow: skipped epoch_end events it cannot read (AttributeError")


@pytest.mark.parametrize("key", ["mlflow", "wandb"])
def test_a_missing_tracker_package_says_how_to_install_it(key, tiny_data, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == key else real(name, *a))
    with pytest.raises(ConfigError, match=rf'{key}=true needs .*pip install "libreyolo\[{key}\]"'):
        LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), project=str(tmp_path), epochs=1, **{key: True}, **FAST)
    assert not list(tmp_path.iterdir())  # refused before a run folder was made
    argv = ["train", f"data={tiny_data}", f"project={tmp_path}", "epochs=1", "device=cpu", f"{key}=true"]
    assert main(argv) == 2
    assert f'pip install "libreyolo[{key}]"' in capsys.readouterr().err
