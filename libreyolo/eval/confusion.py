"""The detection confusion matrix through faster-coco-eval's own class-agnostic matching (PreviewResults:
detections above `conf` matched to ground truth of any class at IoU >= `iou`), laid out as rows = true class,
columns = predicted class, with a background row (detections that matched no object: false positives) and a
background column (objects no detection matched: missed)."""

from __future__ import annotations

import numpy as np

from libreyolo.eval.coco import coco_dicts

CM_CONF = 0.25  # detections below this confidence are not counted (Ultralytics' default for the matrix)
CM_IOU = 0.45  # a detection matches an object at this IoU or more


def confusion_matrix(
    images: np.ndarray, gt: np.ndarray, dt: np.ndarray, nc: int, conf: float = CM_CONF, iou: float = CM_IOU
) -> np.ndarray:
    """(nc + 1, nc + 1) counts: [true, predicted], index nc is the background (row: a detection that matched no
    object; column: an object no detection matched). images (I, 3) id, height, width; gt (n, 6) image id, class,
    x1, y1, x2, y2; dt (m, 7) the same and score."""
    from faster_coco_eval import COCO
    from faster_coco_eval.extra import PreviewResults

    dt = dt[dt[:, 6] >= conf]  # the matching drops the others: not built into COCO's dicts at all
    cm = np.zeros((nc + 1, nc + 1), np.int64)
    if not len(gt) and not len(dt):
        return cm
    if not len(dt):  # nothing kept: every object is missed
        cm[:nc, nc] = np.bincount(gt[:, 1].astype(np.int64), minlength=nc)[:nc]
        return cm
    quiet = {"print_function": lambda *a, **k: None}
    img_dicts, categories, gt_anns, dt_anns = coco_dicts(images, gt, dt, np.arange(nc))
    cgt = COCO({"images": img_dicts, "annotations": gt_anns, "categories": categories}, **quiet)
    cdt = COCO({"images": img_dicts, "annotations": dt_anns, "categories": categories}, **quiet)
    # K rows (true class) of K predicted classes, then false positives and missed objects per class
    got = PreviewResults(cgt, cdt, iou_tresh=iou, min_score=conf, useCats=False).compute_confusion_matrix()
    cm[:nc, :nc] = got[:, :nc].round().astype(np.int64)
    cm[nc, :nc] = got[:, nc].round().astype(np.int64)
    cm[:nc, nc] = got[:, nc + 1].round().astype(np.int64)
    return cm
