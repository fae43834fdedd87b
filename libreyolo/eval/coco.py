"""mAP through faster-coco-eval (a maintained COCO evaluator): no hand-written matching here.

Costs measured on the 2-core CPU machine (docs/performance.md) and what follows from them:
- faster-coco-eval takes annotations as Python dicts. They are built here from whole columns (`tolist` then one
  comprehension) with the cyclic garbage collector paused: a million dicts otherwise trigger collections that
  walk every one of them again and again (3.0 -> 1.3 s for 300,000 detections).
- detections go in through COCO's constructor, not `loadRes`, which walks them again to add polygon outlines a
  box evaluation never reads. faster-coco-eval's numpy input (`loadRes(ndarray)`) builds the same dicts row by
  row and then adds the outlines: 0.29 CPU s for 60,000 detections, against 0.07 s here.
- only what the metrics read is evaluated: the 'all' area range at 100 detections per image and class (the
  standard maxDets the reported mAP uses). The three other area ranges and the 1- and 10-detection caps would
  be computed and thrown away: half of the C++ evaluation's time (1.76 -> 0.84 s for 300,000 detections).
  The precision array for what is kept is the same to the bit as in a full evaluation, so mAP equals
  faster-coco-eval's own summary (tests/test_coco.py).
- categories are independent in COCO evaluation, so a large evaluation (COCO val2017: 5,000 images, up to
  1.5 M detections, 12 s of CPU in one process here, 34 s before these changes) can be split by categories
  over processes and the per-category precision curves put back together in category order: the same array,
  the same means.
- inside training on a GPU the evaluation runs in a kept child process (EvalProcess): faster-coco-eval holds the
  interpreter lock through its evaluation (30-90 ms an epoch for 200 images in the race, more for larger sets),
  and the training loop, which needs it to queue each step, would wait that long while the GPU runs dry."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from libreyolo.eval.perclass import curves, per_class_table
from libreyolo.forked import KeptChild, forked_pool

MAX_DETS = 100  # per image and class, as COCO's headline mAP
PARALLEL_MIN_DETECTIONS = 200_000  # below this, starting processes costs more than it saves


def load_evaluator() -> None:
    """Import faster-coco-eval now (~0.2 s of the first evaluation on the 2-core CPU machine), off a run's first
    validation."""
    import faster_coco_eval  # noqa: F401


class CocoAccumulator:
    """Collects ground truth and detections (original-image pixels, xyxy) and evaluates COCO-style.

    Either one image at a time (`add`, with its ground truth), or whole batches (`add_batch`) when the dataset's
    ground truth was given once up front as `ground_truth=(rows, sizes)`: rows (n, 6) image id, class, x1, y1, x2,
    y2 for every image of the dataset, sizes (I, 2) height, width indexed by image id."""

    def __init__(self, names: list[str], ground_truth: tuple[np.ndarray, np.ndarray] | None = None):
        self.names = names
        self._all_gt = ground_truth
        self._ids: list[np.ndarray] = []  # image ids added, in order
        self._sizes: list[np.ndarray] = []  # (h, w) of images added one at a time
        self._gt: list[np.ndarray] = []  # (n, 6) image id, class, x1, y1, x2, y2 of images added one at a time
        self._dt: list[np.ndarray] = []  # (m, 7) image id, class, x1, y1, x2, y2, score

    def add(
        self,
        image_id: int,
        size_hw: tuple[int, int],
        gt: np.ndarray,
        boxes: np.ndarray,
        scores: np.ndarray,
        classes: np.ndarray,
    ) -> None:
        """One image: gt (n, 5) class, x1, y1, x2, y2; boxes (m, 4) xyxy; scores (m,); classes (m,)."""
        if self._all_gt is not None:
            raise ValueError("this accumulator takes the dataset's ground truth: add whole batches with add_batch")
        self._ids.append(np.array([image_id], np.int64))
        self._sizes.append(np.array([size_hw], np.float64))
        self._gt.append(np.column_stack([np.full(len(gt), image_id), np.asarray(gt, np.float64).reshape(-1, 5)]))
        self._dt.append(
            np.column_stack([np.full(len(boxes), image_id), classes, np.asarray(boxes).reshape(-1, 4), scores]).astype(
                np.float64
            )
        )

    def add_batch(self, image_ids: np.ndarray, dets: np.ndarray) -> None:
        """A batch: image_ids (B,) dataset image ids; dets (N, 7) batch position, x1, y1, x2, y2, score, class."""
        if self._all_gt is None:
            raise ValueError("add_batch needs the dataset's ground truth (CocoAccumulator(names, ground_truth=...))")
        image_ids = np.asarray(image_ids, np.int64)
        self._ids.append(image_ids)
        d = np.asarray(dets, np.float64).reshape(-1, 7)
        self._dt.append(np.column_stack([image_ids[d[:, 0].astype(np.int64)], d[:, 6], d[:, 1:5], d[:, 5]]))

    @property
    def num_images(self) -> int:
        return sum(map(len, self._ids))

    @property
    def num_detections(self) -> int:
        return sum(map(len, self._dt))

    def evaluate(self, workers: int = 1, process: EvalProcess | None = None) -> dict[str, Any]:
        """-> map50, map (50-95), precision and recall (mean over classes at each class's best-F1 point, IoU 0.5);
        per_class (eval/perclass.py's table, in names order); curves (the PR, P, R and F1 curve data, None when
        nothing was evaluated); boxes (images, gt, dt: what was evaluated, for the confusion matrix and plots).
        workers > 1 splits a large evaluation by categories over that many processes; otherwise `process` (if
        given) runs it."""
        ids, images, gt = self._images_and_gt()
        dt = np.concatenate(self._dt) if self._dt else np.zeros((0, 7))
        # ground truth crossing an image's edge is clipped to it exactly as the detections are: a perfect
        # prediction of such an object then matches it at IoU 1
        gt, dt = clip_to_images(gt, images), clip_to_images(dt, images)
        boxes = {"images": images, "gt": gt, "dt": dt}
        if not len(gt) or not len(dt):
            none = np.full((1, 1, len(self.names)), -1.0)
            table = per_class_table(self.names, gt, none, np.zeros(1), np.array([0.5]))
            return {
                "map50": 0.0,
                "map": 0.0,
                "precision": 0.0,
                "recall": 0.0,
                "per_class": table,
                "curves": None,
                "boxes": boxes,
            }
        nc = len(self.names)
        groups = (
            _category_groups(dt[:, 1], nc, workers)
            if workers > 1 and len(dt) >= PARALLEL_MIN_DETECTIONS
            else [np.arange(nc)]
        )
        if len(groups) == 1:
            run = process.run if process is not None else _evaluate
            precision, rec_thrs, iou_thrs, tp = run(images, gt, dt, np.arange(nc))
        else:
            with forked_pool(len(groups)) as pool:
                parts = list(pool.map(_evaluate, *zip(*[_only(images, gt, dt, g) for g in groups])))
            precision = np.empty(parts[0][0].shape[:2] + (nc,), np.float64)
            tp = np.zeros(len(dt), bool)
            for g, (p, _, _, hit) in zip(groups, parts):
                precision[:, :, g], tp[np.isin(dt[:, 1], g)] = p, hit
            _, rec_thrs, iou_thrs, _ = parts[0]  # every group is evaluated at the same thresholds
        # as COCOeval._summarize: the mean over the valid entries of precision[T, R, K] (at IoU 0.5 for map50)
        t50 = np.where(iou_thrs == 0.5)[0]
        m, m50 = _valid_mean(precision), _valid_mean(precision[t50])
        p, r = _best_f1_point(precision, rec_thrs)
        return {
            "map": max(m, 0.0),
            "map50": max(m50, 0.0),
            "precision": p,
            "recall": r,
            "per_class": per_class_table(self.names, gt, precision, rec_thrs, iou_thrs),
            "curves": curves(precision, rec_thrs, iou_thrs, dt, tp, gt),
            "boxes": boxes,
        }

    def _images_and_gt(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> image ids, images (I, 3) id, height, width, ground truth rows (n, 6) of those images."""
        ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.int64)
        if self._all_gt is None:  # images added one at a time, with their ground truth
            sizes = np.concatenate(self._sizes) if self._sizes else np.zeros((0, 2))
            gt = np.concatenate(self._gt) if self._gt else np.zeros((0, 6))
        else:
            rows, all_sizes = self._all_gt
            sizes, gt = all_sizes[ids].reshape(-1, 2), rows[np.isin(rows[:, 0], ids)]
        return ids, np.column_stack([ids, sizes]), gt


class EvalProcess(KeptChild):
    """The kept child (libreyolo/forked.py) the COCO evaluation of each validation runs in: it runs only numpy and
    faster-coco-eval."""

    def run(
        self, images: np.ndarray, gt: np.ndarray, dt: np.ndarray, cats: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.call(_evaluate, images, gt, dt, cats)


def clip_to_images(rows: np.ndarray, images: np.ndarray) -> np.ndarray:
    """rows (n, 6+) image id, class, x1, y1, x2, y2, ... -> a copy with the boxes clipped to their image, given
    images (I, 3) id, height, width."""
    if not len(rows):
        return rows
    order = np.argsort(images[:, 0], kind="stable")
    k = order[np.searchsorted(images[order, 0], rows[:, 0])]
    h, w = images[k, 1], images[k, 2]
    out = rows.copy()
    for col, hi in ((2, w), (3, h), (4, w), (5, h)):
        out[:, col] = np.clip(out[:, col], 0.0, hi)
    return out


def _only(images: np.ndarray, gt: np.ndarray, dt: np.ndarray, cats: np.ndarray) -> tuple[np.ndarray, ...]:
    return images, gt[np.isin(gt[:, 1], cats)], dt[np.isin(dt[:, 1], cats)], cats


def _category_groups(classes: np.ndarray, nc: int, workers: int) -> list[np.ndarray]:
    """Categories split into up to `workers` groups of about equal detection counts (each group in order)."""
    counts = np.bincount(classes.astype(np.int64), minlength=nc)
    order = np.argsort(-counts, kind="stable")
    load, groups = np.zeros(min(workers, nc)), [[] for _ in range(min(workers, nc))]
    for c in order:  # largest first, each to the lightest group
        k = int(load.argmin())
        groups[k].append(c)
        load[k] += counts[c]
    return [np.sort(np.array(g, np.int64)) for g in groups if g]


def coco_dicts(
    images: np.ndarray, gt: np.ndarray, dt: np.ndarray, cats: np.ndarray
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """-> COCO's image, category, ground-truth and detection dicts of these arrays (images (I, 3) id, height, width;
    gt (n, 6) image id, class, x1, y1, x2, y2; dt (m, 7) the same and score)."""
    categories = [{"id": int(c), "name": str(int(c))} for c in cats]
    img_dicts = [{"id": int(i), "height": int(h), "width": int(w)} for i, h, w in images.tolist()]
    return img_dicts, categories, _annotations(gt, None), _annotations(dt[:, :6], dt[:, 6])


def _evaluate(
    images: np.ndarray, gt: np.ndarray, dt: np.ndarray, cats: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """faster-coco-eval on these images and categories -> precision (T, R, K) at area 'all' and MAX_DETS, the
    recall thresholds (R,), the IoU thresholds (T,) and which detections (dt's rows) the evaluator matched to an
    object at IoU 0.5 or more."""
    quiet = {"print_function": lambda *a, **k: None}
    enabled = gc.isenabled()
    gc.disable()  # see the module docstring
    try:
        from faster_coco_eval import COCO, COCOeval_faster  # on first use: not part of a run's start-up

        img_dicts, categories, gt_anns, dt_anns = coco_dicts(images, gt, dt, cats)
        cgt = COCO({"images": img_dicts, "annotations": gt_anns, "categories": categories}, **quiet)
        cdt = COCO({"images": img_dicts, "annotations": dt_anns, "categories": categories}, **quiet)
        ev = COCOeval_faster(cgt, cdt, "bbox", **quiet)
        p = ev.params
        p.areaRng, p.areaRngLbl, p.maxDets = p.areaRng[:1], p.areaRngLbl[:1], [MAX_DETS]
        ev.evaluate()
        ev.accumulate()
    finally:
        if enabled:
            gc.enable()
    # its matches, "detection id_object id" -> IoU; detection ids are dt's rows from 1 (_annotations)
    tp = np.zeros(len(dt), bool)
    tp[[int(k.split("_", 1)[0]) - 1 for k, iou in ev.eval["matched"].items() if iou >= 0.5]] = True
    return ev.eval["precision"][:, :, :, 0, 0], np.asarray(p.recThrs), np.asarray(p.iouThrs), tp


def _annotations(rows: np.ndarray, scores: np.ndarray | None) -> list[dict[str, Any]]:
    """(n, 6) image id, class, x1, y1, x2, y2 (+ scores) -> complete COCO annotation dicts, ids from 1."""
    if not len(rows):
        return []
    w, h = rows[:, 4] - rows[:, 2], rows[:, 5] - rows[:, 3]
    cols = (
        rows[:, 0].astype(np.int64).tolist(),
        rows[:, 1].astype(np.int64).tolist(),
        rows[:, 2].tolist(),
        rows[:, 3].tolist(),
        w.tolist(),
        h.tolist(),
        (w * h).tolist(),
    )
    if scores is None:  # ground truth; a 7th column marks crowd boxes (data/dataset.py ground_truth)
        crowd = rows[:, 6].astype(np.int64).tolist() if rows.shape[1] > 6 else [0] * len(rows)
        return [
            {"id": k, "image_id": i, "category_id": c, "bbox": [x, y, bw, bh], "area": a, "iscrowd": z}
            for k, (i, c, x, y, bw, bh, a, z) in enumerate(zip(*cols, crowd), 1)
        ]
    return [
        {"id": k, "image_id": i, "category_id": c, "bbox": [x, y, bw, bh], "area": a, "iscrowd": 0, "score": s}
        for k, (i, c, x, y, bw, bh, a, s) in enumerate(zip(*cols, scores.tolist()), 1)
    ]


def _valid_mean(s: np.ndarray) -> float:
    v = s[s > -1]
    return float(np.mean(v)) if len(v) else -1.0


def _best_f1_point(precision: np.ndarray, rec_thrs: np.ndarray) -> tuple[float, float]:
    """precision[T, R, K] -> mean over classes of (P, R) where each class's F1 peaks, at IoU 0.5."""
    pr = precision[0]  # (R, K)
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
