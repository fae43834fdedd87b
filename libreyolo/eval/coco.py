"""mAP through faster-coco-eval (a maintained COCO evaluator): no hand-written matching here."""

from __future__ import annotations

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster


class CocoAccumulator:
    """Collects ground truth and detections (original-image pixels, xyxy) and evaluates COCO-style.

    `add` only keeps arrays; the COCO annotation dicts are made once in `evaluate`, complete (id, area,
    iscrowd), and detections go in through COCO's constructor rather than `loadRes`, which would walk them
    again to add polygon outlines a box evaluation never reads (with an untrained network's 60,000
    detections, loadRes alone took over a second per validation in a profiled run on the H200 machine)."""

    def __init__(self, names: list[str]):
        self.names = names
        self.images: list[dict] = []
        self._gt: list[np.ndarray] = []  # (n, 6) image_id, class, x1, y1, x2, y2
        self._dt: list[np.ndarray] = []  # (m, 7) image_id, class, x1, y1, x2, y2, score

    def add(self, image_id: int, size_hw: tuple[int, int], gt: np.ndarray, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> None:
        """gt: (n, 5) class, x1, y1, x2, y2; boxes (m, 4) xyxy; scores (m,); classes (m,)."""
        h, w = size_hw
        self.images.append({"id": image_id, "height": int(h), "width": int(w)})
        self._gt.append(np.column_stack([np.full(len(gt), image_id), np.asarray(gt, np.float64).reshape(-1, 5)]))
        self._dt.append(np.column_stack([np.full(len(boxes), image_id), classes, np.asarray(boxes).reshape(-1, 4), scores]).astype(np.float64))

    def _dataset(self, rows: list[np.ndarray], scored: bool) -> dict:
        anns = []
        for k, r in enumerate(np.concatenate(rows).tolist() if rows else []):
            w, h = r[4] - r[2], r[5] - r[3]
            ann = {"id": k + 1, "image_id": int(r[0]), "category_id": int(r[1]), "bbox": [r[2], r[3], w, h], "area": w * h, "iscrowd": 0}
            if scored:
                ann["score"] = r[6]
            anns.append(ann)
        return {"images": self.images, "annotations": anns, "categories": [{"id": i, "name": n} for i, n in enumerate(self.names)]}

    def evaluate(self) -> dict[str, float]:
        """-> map50, map (50-95), precision and recall (mean over classes at each class's best-F1 point, IoU 0.5)."""
        zero = {"map50": 0.0, "map": 0.0, "precision": 0.0, "recall": 0.0}
        if not sum(map(len, self._gt)) or not sum(map(len, self._dt)):
            return zero
        quiet = {"print_function": lambda *a, **k: None}
        gt, dt = COCO(self._dataset(self._gt, False), **quiet), COCO(self._dataset(self._dt, True), **quiet)
        ev = COCOeval_faster(gt, dt, "bbox", **quiet)
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
