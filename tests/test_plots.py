"""The pictures a run leaves in its folder (libreyolo/plots): every plot of a detection run and of a classifier run
exists, opens as an image of a sensible size and is not blank; plots=false writes none; the writer keeps only the
first three batches of the first epoch, goes on without matplotlib (one warning) and never fails the run; the
training process itself never draws (a forked child does, or the writer's thread where the child died)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.events import read_events
from libreyolo.plots import PlotWriter, figures
from libreyolo.plots import writer as W

DETECT_PLOTS = [
    "results.png",
    "PR_curve.png",
    "F1_curve.png",
    "P_curve.png",
    "R_curve.png",
    "confusion_matrix.png",
    "confusion_matrix_normalized.png",
    "labels.jpg",
    *(f"train_batch{k}.jpg" for k in range(3)),
    *(f"val_batch{k}_{kind}.jpg" for k in range(3) for kind in ("labels", "pred")),
]
CLASSIFY_PLOTS = [
    "results.png",
    "confusion_matrix.png",
    "confusion_matrix_normalized.png",
    "topk.png",
    "misclassified.jpg",
    *(f"train_batch{k}.jpg" for k in range(3)),
]
FAST = dict(imgsz=64, batch=4, workers=0, device="cpu", warmup_epochs=0)


def assert_pictures(run: Path, names: list[str]) -> None:
    for name in names:
        img = cv2.imread(str(run / name))
        assert img is not None, f"{name} is missing or unreadable"
        assert min(img.shape[:2]) >= 100 and max(img.shape[:2]) <= 4000, (name, img.shape)
        assert img.reshape(-1, 3).std(0).max() > 5, f"{name} is blank"
    assert not list(run.glob(".*tmp*")), "a temporary file was left behind"


@pytest.fixture(scope="module")
def plot_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 training images (four batches of 4) and 24 validation images (three batches of the validation loader's 8)."""
    from libreyolo.data.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("plots") / "shapes", n_train=16, n_val=24, size=64)


def test_a_detection_run_leaves_every_plot(plot_data: Path, tmp_path: Path) -> None:
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(plot_data), project=str(tmp_path), epochs=2, **FAST)
    run = m.last_run
    assert_pictures(run, DETECT_PLOTS)
    warnings = [e for e in read_events(run / "events.jsonl") if e["type"] == "warning" and e["code"] == "plots"]
    assert warnings == []


def test_plots_false_writes_none(plot_data: Path, tmp_path: Path) -> None:
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(plot_data), project=str(tmp_path), epochs=1, plots=False, **FAST)
    assert sorted(p.name for p in m.last_run.iterdir() if p.suffix in (".png", ".jpg")) == []


def test_a_classifier_run_leaves_its_plots(tmp_path: Path) -> None:
    from test_classify import image_folder

    data = image_folder(tmp_path / "folder", per_class=6)
    m = LibreYOLO("LibreResNet18")
    m.train(data=str(data), project=str(tmp_path / "runs"), epochs=1, **{**FAST, "imgsz": 32})
    run = m.last_run
    assert_pictures(run, CLASSIFY_PLOTS)
    assert not (run / "PR_curve.png").exists() and not (run / "labels.jpg").exists()


def _batch(b: int = 2, size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    img = torch.randint(0, 255, (b, size, size, 3), dtype=torch.uint8)
    targets = torch.tensor([[[0, 5, 5, 30, 30], [1, 20, 20, 60, 50]]] * b, dtype=torch.float32)
    return img, targets, torch.ones(b, 2, dtype=torch.bool)


def test_only_the_first_three_batches_of_the_first_epoch_are_kept(tmp_path: Path, monkeypatch) -> None:
    w = PlotWriter(tmp_path, ["a", "b"], "detect", epochs=3)
    copies = []
    real = W.J.to_host
    monkeypatch.setattr(W.J, "to_host", lambda t: copies.append(1) or real(t))
    for epoch in (1, 2):  # a resumed run: its first epoch is 1
        for _ in range(5):
            w.train_batch(epoch, *_batch())
    w.close()
    assert len(copies) == 3
    assert sorted(p.name for p in tmp_path.glob("*.jpg")) == [f"train_batch{k}.jpg" for k in range(3)]
    assert_pictures(tmp_path, [f"train_batch{k}.jpg" for k in range(3)])


def test_without_matplotlib_one_warning_and_the_mosaics_still_come(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(figures, "available", lambda: False)
    said: list[str] = []
    labels = [np.array([[0, 0.5, 0.5, 0.2, 0.2]], np.float32)]
    w = PlotWriter(tmp_path, ["a", "b"], "detect", epochs=1, train_labels=labels, warn=said.append)
    w.train_batch(0, *_batch())
    w.validation(0, {"map50": 0.0, "curves": None, "boxes": None})
    w.close()
    assert len(said) == 1 and "matplotlib" in said[0] and "libreyolo[plots]" in said[0]
    assert [p.name for p in tmp_path.iterdir()] == ["train_batch0.jpg"]


def test_a_failing_plot_is_reported_once_and_the_run_goes_on(tmp_path: Path) -> None:
    said: list[str] = []
    w = PlotWriter(tmp_path, ["a"], "detect", epochs=1, warn=said.append)
    (tmp_path / "results.csv").write_text("epoch,time,metrics/mAP50(B)\nnot a number,1,0.5\n")
    w.validation(0, {"map50": 0.0, "curves": None, "boxes": None})
    w.close()
    assert len(said) == 1 and "results failed" in said[0] and "ValueError" in said[0]


def test_disabled_writer_does_nothing(tmp_path: Path) -> None:
    w = PlotWriter(tmp_path, ["a"], "detect", enabled=False, train_labels=[np.zeros((1, 5), np.float32)])
    w.train_batch(0, *_batch())
    w.validation(0, {"map50": 0.0, "curves": None, "boxes": None})
    w.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the drawing child is forked on Linux only")
def test_the_training_process_never_draws_the_child_does(plot_data: Path, tmp_path: Path) -> None:
    # matplotlib holds the interpreter lock while it draws: in the training process it would hold up the loop
    script = (
        "import sys\nfrom libreyolo import LibreYOLO\n"
        f"m = LibreYOLO('LibreYOLO9t')\nm.train(data={str(plot_data)!r}, project={str(tmp_path)!r}, epochs=1, "
        "imgsz=64, batch=4, workers=0, device='cpu', warmup_epochs=0)\n"
        "print('matplotlib' in sys.modules, m.last_run)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    imported, run = out.stdout.split()[-2:]
    assert imported == "False"
    assert_pictures(Path(run), ["results.png", "PR_curve.png", "labels.jpg", "train_batch0.jpg", "val_batch0_pred.jpg"])


def test_a_child_that_died_leaves_the_drawing_to_the_thread(tmp_path: Path) -> None:
    w = PlotWriter(tmp_path, ["a", "b"], "detect", epochs=3, child=True)
    assert w._child is not None and w._child._pool is not None
    for p in w._child._pool._processes.values():  # the child dies before the first job reaches it
        p.kill()
        p.join()
    w.train_batch(0, *_batch())
    w.close()
    assert_pictures(tmp_path, ["train_batch0.jpg"])


def _curves(nc: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {"recall": np.linspace(0, 1, 101), "precision": rng.random((101, nc)), "conf": np.linspace(0, 1, 200)}
    return {**out, **{k: rng.random((200, nc)) for k in ("f1", "p", "r")}}


def test_the_final_validation_is_drawn_on_several_lanes_at_once(tmp_path: Path, monkeypatch) -> None:
    # a run's end waits for these pictures: results.png, the curves and the confusion matrices are drawn side by
    # side. The first drawing of each waits at a barrier of three, which only lanes that run at the same time pass.
    import threading

    meet = threading.Barrier(3, timeout=20)
    for name in ("results", "conf_curve", "confusion"):
        real, first = getattr(figures, name), threading.Event()

        def drawn(*a, _real=real, _first=first, **k):
            if not _first.is_set():
                _first.set()
                meet.wait()
            return _real(*a, **k)

        monkeypatch.setattr(figures, name, drawn)
    monkeypatch.setattr(figures, "available", lambda: True)
    (tmp_path / "results.csv").write_text("epoch,metrics/mAP50(B),train/box_loss\n1,0.5,1.0\n2,0.6,0.9\n")
    said: list[str] = []
    boxes = {"images": np.zeros((0, 3)), "gt": np.zeros((0, 6)), "dt": np.zeros((0, 7))}
    w = PlotWriter(tmp_path, ["a", "b"], "detect", epochs=1, warn=said.append, child=False)
    w.validation(0, {"map50": 0.5, "curves": _curves(), "boxes": boxes})
    w.close()
    assert said == []
    assert_pictures(tmp_path, ["results.png", "PR_curve.png", "F1_curve.png", "confusion_matrix.png"])


def test_a_later_validation_s_pictures_are_never_overwritten_by_an_earlier_one(tmp_path: Path, monkeypatch) -> None:
    # a picture is drawn on one lane, in the order its validations came: the earlier, slower drawing of PR_curve.png
    # finishes before the final one starts
    import time

    written: list[float] = []

    def pr_curve(curves, names, map50, out):
        time.sleep(0.3 if map50 < 0.5 else 0.0)
        out.write_text(str(map50))
        written.append(map50)

    monkeypatch.setattr(figures, "pr_curve", pr_curve)
    monkeypatch.setattr(figures, "available", lambda: True)
    w = PlotWriter(tmp_path, ["a", "b"], "detect", epochs=2, child=False, interval_s=0.0)
    w.validation(0, {"map50": 0.25, "curves": _curves(), "boxes": None})
    w.validation(1, {"map50": 0.75, "curves": _curves(), "boxes": None})
    w.close()
    assert written == [0.25, 0.75] and (tmp_path / "PR_curve.png").read_text() == "0.75"


def test_the_validation_labels_are_drawn_at_the_first_validation_and_the_end_draws_only_predictions(
    tmp_path: Path, monkeypatch
) -> None:
    # val_batchN_labels.jpg is the same at every validation: drawn once, at the first, even where that validation's
    # other plots are skipped (interval_s), so that a run's end, which waits for its pictures, draws fewer; a
    # validation that is plotted draws both in one job (its images are read once)
    from libreyolo.plots import jobs

    drawn: list[tuple[int, tuple[str, ...]]] = []  # (the validation's epoch, what was drawn)
    monkeypatch.setattr(
        jobs, "val_mosaics_job", lambda samples, names, run_dir, kinds: drawn.append((samples[0], kinds))
    )
    monkeypatch.setattr(jobs, "val_samples", lambda result, data, batch, batches: [result["epoch"]])
    for epochs in (3, 1):
        drawn.clear()
        w = PlotWriter(tmp_path, ["a"], "detect", epochs=epochs, child=False, interval_s=3600.0, val_dataset=object())
        for epoch in range(epochs):
            w.validation(epoch, {"map50": 0.0, "curves": None, "boxes": None, "epoch": epoch})
        w.close()
        expected = [(0, ("labels", "pred"))] if epochs == 1 else [(0, ("labels",)), (epochs - 1, ("pred",))]
        assert drawn == expected, (epochs, drawn)
