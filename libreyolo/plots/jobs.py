"""The plot writer's jobs, one per picture or group of pictures. The `*_job` functions draw: each takes host arrays
only, so it can run in the writer's child process. host_arrays, val_samples and misclassified gather those arrays
on the writer's thread (they wait on CUDA copies or read this process's validation dataset)."""

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


def host_arrays(host: tuple[Any, ...], ready: Any) -> tuple[np.ndarray, ...]:
    """to_host's copies as numpy arrays, once they have landed (run on the writer's thread: it waits on CUDA)."""
    if ready is not None:
        ready.synchronize()
    return tuple(t.numpy() for t in host)


def train_batch_job(
    img: np.ndarray, targets: np.ndarray, mask: np.ndarray, names: list[str], task: str, path: Path
) -> None:
    img = img[:MAX_TILES]
    rows = [targets[b][mask[b].astype(bool)] for b in range(len(img))]
    if task == "classify":  # the class is the whole image's: a title, not a box
        titles = [names[int(r[0, 0])] if len(r) else "" for r in rows]
        write_jpg(mosaic(list(img), [np.zeros((0, 5))] * len(img), names, titles), path)
    else:
        write_jpg(mosaic(list(img), rows, names), path)


def labels_job(labels: list[np.ndarray], names: list[str], path: Path) -> None:
    figures.labels_plot(labels, names, path)


Samples = list[tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]]


def val_samples(result: dict[str, Any], val_dataset: Any, val_batch: int, batches: int) -> Samples:
    """The first `batches` validation batches as the network saw them: per batch the images, their labels and the
    predictions from PRED_CONF on, (n, 5) and (n, 6) rows in the images' pixels. Read on the writer's thread (the
    dataset may be a RAM cache of this process)."""
    if val_dataset is None:
        return []
    boxes = result.get("boxes")
    dt = boxes["dt"] if boxes is not None else np.zeros((0, 7))
    dt = dt[dt[:, 6] >= PRED_CONF]
    out: Samples = []
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
        out.append((imgs, labels, preds))
    return out


CONF_CURVES = {"f1": ("F1_curve", "F1"), "p": ("P_curve", "Precision"), "r": ("R_curve", "Recall")}


def curves_job(curves: dict[str, Any], names: list[str], map50: float, run_dir: Path, which: tuple[str, ...]) -> None:
    """Some of a detector's curves: "pr" (PR_curve.png) and "f1", "p", "r" (F1_curve.png, P_curve.png, R_curve.png),
    so that the writer's lanes can draw them side by side."""
    for key in which:
        if key == "pr":
            figures.pr_curve(curves, names, map50, run_dir / "PR_curve.png")
        else:
            name, label = CONF_CURVES[key]
            figures.conf_curve(curves, names, key, label, run_dir / f"{name}.png")


def confusion_job(boxes: dict[str, np.ndarray], names: list[str], run_dir: Path) -> None:
    """A detector's confusion matrices, counts and normalised (with the background row and column)."""
    cm = confusion_matrix(boxes["images"], boxes["gt"], boxes["dt"], len(names))
    figures.confusion(cm, names, False, run_dir / "confusion_matrix.png")
    figures.confusion(cm, names, True, run_dir / "confusion_matrix_normalized.png")


def val_mosaics_job(samples: Samples, names: list[str], run_dir: Path, kinds: tuple[str, ...]) -> None:
    """val_batchN_labels.jpg and / or val_batchN_pred.jpg (kinds "labels", "pred") of the samples (val_samples)."""
    for b, (imgs, labels, preds) in enumerate(samples):
        for kind, rows in (("labels", labels), ("pred", preds)):
            if kind in kinds:
                write_jpg(mosaic(imgs, rows, names), run_dir / f"val_batch{b}_{kind}.jpg")


def misclassified(result: dict[str, Any], names: list[str], val_dataset: Any) -> tuple[list[np.ndarray], list[str]]:
    """Up to MAX_TILES validation images whose best guess was wrong and their titles 'true > predicted', read on the
    writer's thread."""
    if "pred" not in result or val_dataset is None:
        return [], []
    label, pred, index = (np.asarray(result[k], np.int64) for k in ("label", "pred", "index"))
    imgs, titles = [], []
    for j in np.flatnonzero(label != pred)[:MAX_TILES]:
        item = val_dataset[int(index[j])]
        if item["img"] is not None:
            imgs.append(item["img"])
            titles.append(f"{names[label[j]]} > {names[pred[j]]}")
    return imgs, titles


def classify_job(
    label: np.ndarray,
    pred: np.ndarray,
    topk: list[float],
    names: list[str],
    wrong: tuple[list[np.ndarray], list[str]],
    run_dir: Path,
    mpl: bool,
) -> None:
    """A classifier's confusion matrices (no background: every image gets a class), topk.png, and misclassified.jpg
    (the misclassified images, titled)."""
    nc = len(names)
    if mpl:
        cm = np.zeros((nc, nc), np.int64)
        np.add.at(cm, (label, pred), 1)
        figures.confusion(cm, names, False, run_dir / "confusion_matrix.png", background=False)
        figures.confusion(cm, names, True, run_dir / "confusion_matrix_normalized.png", background=False)
        figures.topk_plot(list(topk), run_dir / "topk.png")
    imgs, titles = wrong
    if imgs:
        write_jpg(mosaic(imgs, [np.zeros((0, 5))] * len(imgs), names, titles), run_dir / "misclassified.jpg")
