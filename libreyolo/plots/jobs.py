"""What the plot writer's thread runs: one job per picture or group of pictures, each a function of host arrays
(and, for the validation mosaics, the validation dataset they reload their images from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from libreyolo.eval.confusion import confusion_matrix
from libreyolo.plots import figures
from libreyolo.plots.mosaics import MAX_TILES, PRED_CONF, mosaic, write_jpg


def to_host(tensors: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
    """Host copies of these tensors and what to wait on before reading them: a CUDA event behind copies queued on
    the current stream into page-locked memory (the caller does not wait), or None for copies made here."""
    import torch

    if not any(t.is_cuda for t in tensors):
        return tuple(t.clone() for t in tensors), None  # the loader may reuse its buffers for the next batch
    out = []
    for t in tensors:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        out.append(host)
    ready = torch.cuda.Event()
    ready.record()
    return tuple(out), ready


def train_batch_job(host: tuple[Any, ...], ready: Any, names: list[str], task: str, path: Path) -> None:
    if ready is not None:
        ready.synchronize()
    img, targets, mask = (t.numpy() for t in host)
    img = img[:MAX_TILES]
    rows = [targets[b][mask[b].astype(bool)] for b in range(len(img))]
    if task == "classify":  # the class is the whole image's: a title, not a box
        titles = [names[int(r[0, 0])] if len(r) else "" for r in rows]
        write_jpg(mosaic(list(img), [np.zeros((0, 5))] * len(img), names, titles), path)
    else:
        write_jpg(mosaic(list(img), rows, names), path)


def labels_job(labels: list[np.ndarray], names: list[str], path: Path) -> None:
    figures.labels_plot(labels, names, path)


def detect_job(
    result: dict[str, Any],
    names: list[str],
    val_dataset: Any,
    val_batch: int,
    batches: int,
    run_dir: Path,
    mpl: bool,
) -> None:
    """The PR, F1, P and R curves, the confusion matrices (counts and normalised), and val_batchN_labels.jpg /
    _pred.jpg of the first `batches` validation batches."""
    boxes = result.get("boxes")
    if mpl and result.get("curves") is not None:
        c = result["curves"]
        figures.pr_curve(c, names, float(result.get("map50", 0.0)), run_dir / "PR_curve.png")
        for key, label, name in (("f1", "F1", "F1_curve"), ("p", "Precision", "P_curve"), ("r", "Recall", "R_curve")):
            figures.conf_curve(c, names, key, label, run_dir / f"{name}.png")
    if mpl and boxes is not None:
        cm = confusion_matrix(boxes["images"], boxes["gt"], boxes["dt"], len(names))
        figures.confusion(cm, names, False, run_dir / "confusion_matrix.png")
        figures.confusion(cm, names, True, run_dir / "confusion_matrix_normalized.png")
    if val_dataset is None:
        return
    dt = boxes["dt"] if boxes is not None else np.zeros((0, 7))
    dt = dt[dt[:, 6] >= PRED_CONF]
    for b in range(batches):
        ids = range(b * val_batch, min(b * val_batch + min(val_batch, MAX_TILES), len(val_dataset)))
        if not len(ids):
            break
        imgs, labels, preds = [], [], []
        for i in ids:
            item = val_dataset[i]
            if item["img"] is None:
                continue
            imgs.append(item["img"])
            labels.append(item["boxes"])
            mine = dt[dt[:, 0] == i]  # image id, class, x1, y1, x2, y2, score in original pixels
            xyxy = mine[:, 2:6] * item["scale"] + np.tile(np.asarray(item["pad"], np.float64), 2)
            preds.append(np.column_stack([mine[:, 1], xyxy, mine[:, 6]]))
        write_jpg(mosaic(imgs, labels, names), run_dir / f"val_batch{b}_labels.jpg")
        write_jpg(mosaic(imgs, preds, names), run_dir / f"val_batch{b}_pred.jpg")


def classify_job(result: dict[str, Any], names: list[str], val_dataset: Any, run_dir: Path, mpl: bool) -> None:
    """A classifier's confusion matrices (no background: every image gets a class), topk.png, and misclassified.jpg
    (up to MAX_TILES validation images whose best guess was wrong, titled 'true > predicted')."""
    if "pred" not in result:
        return
    label, pred, index = (np.asarray(result[k], np.int64) for k in ("label", "pred", "index"))
    nc = len(names)
    if mpl:
        cm = np.zeros((nc, nc), np.int64)
        np.add.at(cm, (label, pred), 1)
        figures.confusion(cm, names, False, run_dir / "confusion_matrix.png", background=False)
        figures.confusion(cm, names, True, run_dir / "confusion_matrix_normalized.png", background=False)
        figures.topk_plot(list(result["topk"]), run_dir / "topk.png")
    wrong = np.flatnonzero(label != pred)[:MAX_TILES]
    if val_dataset is None or not len(wrong):
        return
    imgs, titles = [], []
    for j in wrong:
        item = val_dataset[int(index[j])]
        if item["img"] is not None:
            imgs.append(item["img"])
            titles.append(f"{names[label[j]]} > {names[pred[j]]}")
    write_jpg(mosaic(imgs, [np.zeros((0, 5))] * len(imgs), names, titles), run_dir / "misclassified.jpg")
