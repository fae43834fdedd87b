"""Per-class detection metrics, the curves and the confusion matrix, all read off faster-coco-eval's own arrays:
no second hand-written AP or matching here.

- the per-class table (class, images, instances, P, R, mAP50, mAP50-95) comes from the evaluator's precision array
  precision[T, R, K] (IoU thresholds, recall thresholds, classes), the same array the run's mAP is the mean of;
- the PR curve of a class is its column of that array at IoU 0.5 (COCO's 101-point interpolated precision), so the
  area under it is the class's AP50;
- the P, R and F1 curves over the confidence threshold pair each recall threshold with the evaluator's score at
  that point (its scores[T, R, K] array): the detection confidence at which the class reaches that recall;
- the confusion matrix (eval/confusion.py) is faster-coco-eval's own class-agnostic matching."""

from __future__ import annotations

from typing import Any

import numpy as np

CURVE_POINTS = 101  # confidence thresholds of the P, R and F1 curves


def per_class_table(
    names: list[str], gt: np.ndarray, precision: np.ndarray, rec_thrs: np.ndarray, iou_thrs: np.ndarray
) -> list[dict[str, Any]]:
    """One row per class in the dataset's names order: class, images, instances, precision, recall (at the class's
    best-F1 point of its IoU-0.5 curve, as the run's P and R), map50, map (50-95). gt (n, 6+) image id, class, ...;
    precision[T, R, K] as the evaluator's. A class without ground truth has None for its metrics."""
    t50 = int(np.where(np.isclose(iou_thrs, 0.5))[0][0])
    cls = gt[:, 1].astype(np.int64) if len(gt) else np.zeros(0, np.int64)
    rows = []
    for k, name in enumerate(names):
        mine = cls == k
        row: dict[str, Any] = {
            "class": name,
            "images": len(np.unique(gt[mine, 0])) if mine.any() else 0,
            "instances": int(mine.sum()),
            "precision": None,
            "recall": None,
            "map50": None,
            "map": None,
        }
        if k < precision.shape[2] and (precision[:, :, k] > -1).any():
            p, r = best_f1_point(precision[t50, :, k], rec_thrs)
            row.update(
                precision=p, recall=r, map50=_mean_valid(precision[t50, :, k]), map=_mean_valid(precision[..., k])
            )
        rows.append(row)
    return rows


def best_f1_point(column: np.ndarray, rec_thrs: np.ndarray) -> tuple[float, float]:
    """One class's interpolated precision over the recall thresholds -> (P, R) where its F1 peaks."""
    col = np.where(column < 0, 0.0, column)
    f1 = 2 * col * rec_thrs / np.maximum(col + rec_thrs, 1e-16)
    best = int(f1.argmax())
    return float(col[best]), float(rec_thrs[best]) if col[best] > 0 else 0.0


def curves(
    precision: np.ndarray, rec_thrs: np.ndarray, iou_thrs: np.ndarray, dt: np.ndarray, tp: np.ndarray, gt: np.ndarray
) -> dict[str, Any]:
    """-> recall (R,), precision (R, K): each class's PR curve, the evaluator's interpolated precision at IoU 0.5;
    and over the confidence thresholds conf (C,): p, r, f1 (C, K), the precision and recall of the detections kept
    at that threshold, counted from the evaluator's own matches (tp: dt's rows matched at IoU 0.5). A class
    without ground truth has NaN columns. dt (m, 7) image id, class, x1, y1, x2, y2, score; gt (n, 6+)."""
    t50 = int(np.where(np.isclose(iou_thrs, 0.5))[0][0])
    pr = precision[t50]  # (R, K)
    nc = pr.shape[1]
    n_gt = np.bincount(gt[:, 1].astype(np.int64), minlength=nc)[:nc] if len(gt) else np.zeros(nc, np.int64)
    conf = np.linspace(0.0, 1.0, CURVE_POINTS)
    p, r = np.ones((len(conf), nc)), np.zeros((len(conf), nc))  # nothing kept: no false positive either
    cls = dt[:, 1].astype(np.int64)
    for k in range(nc):
        mine = cls == k
        if not mine.any():
            continue
        order = np.argsort(-dt[mine, 6], kind="stable")
        score, hits = dt[mine, 6][order], np.cumsum(tp[mine][order])
        kept = np.searchsorted(-score, -conf, side="right")  # detections with score >= each threshold
        got = np.where(kept > 0, hits[np.maximum(kept - 1, 0)], 0)
        p[:, k] = np.where(kept > 0, got / np.maximum(kept, 1), 1.0)
        r[:, k] = got / max(int(n_gt[k]), 1)
    f1 = 2 * p * r / np.maximum(p + r, 1e-16)
    pr = np.where(pr < 0, 0.0, pr)
    for a in (pr, p, r, f1):
        a[:, n_gt == 0] = np.nan
    return {"recall": np.asarray(rec_thrs, np.float64), "precision": pr, "conf": conf, "p": p, "r": r, "f1": f1}


def _mean_valid(a: np.ndarray) -> float:
    v = a[a > -1]
    return float(v.mean()) if len(v) else 0.0
