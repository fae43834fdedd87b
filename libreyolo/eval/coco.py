"""mAP through faster-coco-eval (a maintained COCO evaluator): no hand-written matching here."""

from __future__ import annotations

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster


class CocoAccumulator:
    """Collects ground truth and detections (original-image pixels, xyxy) and evaluates COCO-style."""

    def __init__(self, names: list[str]):
        self.names = names
        self.images: list[dict] = []
        self.gts: list[dict] = []
        self.dets: list[dict] = []

    def add(self, image_id: int, size_hw: tuple[int, int], gt: np.ndarray, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> None:
        """gt: (n, 5) class, x1, y1, x2, y2; boxes (m, 4) xyxy; scores (m,); classes (m,)."""
        h, w = size_hw
        self.images.append({"id": image_id, "height": int(h), "width": int(w)})
        for c, x1, y1, x2, y2 in gt.tolist():
            self.gts.append({"id": len(self.gts) + 1, "image_id": image_id, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        for (x1, y1, x2, y2), s, c in zip(boxes.tolist(), scores.tolist(), classes.tolist()):
            self.dets.append({"image_id": image_id, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1], "score": float(s)})

    def evaluate(self) -> dict[str, float]:
        """-> map50, map (50-95), precision and recall (mean over classes at each class's best-F1 point, IoU 0.5)."""
        zero = {"map50": 0.0, "map": 0.0, "precision": 0.0, "recall": 0.0}
        if not self.gts or not self.dets:
            return zero
        gt = COCO({"images": self.images, "annotations": self.gts, "categories": [{"id": i, "name": n} for i, n in enumerate(self.names)]})
        dt = gt.loadRes(self.dets)
        ev = COCOeval_faster(gt, dt, "bbox", print_function=lambda *a, **k: None)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
        p, r = _best_f1_point(ev.eval["precision"], ev.params.recThrs)
        return {"map": float(max(ev.stats[0], 0.0)), "map50": float(max(ev.stats[1], 0.0)), "precision": p, "recall": r}


def _best_f1_point(precision: np.ndarray, rec_thrs: np.ndarray) -> tuple[float, float]:
    """precision[T, R, K, A, M] -> mean over classes of (P, R) where each class's F1 peaks, at IoU 0.5,
    all areas, the largest detection cap."""
    pr = precision[0, :, :, 0, -1]  # (R, K)
    ps, rs = [], []
    for k in range(pr.shape[1]):
        col = pr[:, k]
        if (col < 0).all():  # class without ground truth
            continue
        col = np.where(col < 0, 0.0, col)
        f1 = 2 * col * rec_thrs / np.maximum(col + rec_thrs, 1e-16)
        best = int(f1.argmax())
        ps.append(col[best])
        rs.append(rec_thrs[best] if col[best] > 0 else 0.0)
    if not ps:
        return 0.0, 0.0
    return float(np.mean(ps)), float(np.mean(rs))
