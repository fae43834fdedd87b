"""The classification dataset: the detection dataset's decode and cache path, with classification's views
(random-resized-crop + flip + HSV for training, short-side resize + centre crop for validation).

Each item carries its class as one whole-image box row (class, 0, 0, imgsz, imgsz), so `collate` makes the
engine's (B, M, 5) targets with the class at targets[:, 0, 0] and mask[:, 0] true: the classifier's loss reads
it there (families/classify/head.py), and the loop, the loaders and the validator need no second layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from libreyolo.data import augment as A
from libreyolo.data.dataset import YOLODataset


class ClassifyDataset(YOLODataset):
    def _item(self, img: np.ndarray, i: int) -> dict[str, Any]:
        box = np.array([[self.labels.labels[i][0, 0], 0, 0, self.imgsz, self.imgsz]], np.float32)
        return {"img": img, "boxes": box, "index": i, "bad": []}

    def _train_item(self, i: int, rng: np.random.Generator, mosaic: bool) -> tuple[np.ndarray, np.ndarray]:
        h = self.hyp
        img, boxes = self._checked_load(i)
        img = A.random_resized_crop(img, rng, self.imgsz, max(0.08, 1.0 - h.scale))
        A.augment_hsv(img, rng, h.hsv_h, h.hsv_s, h.hsv_v)
        img = A.flip(img, np.zeros((0, 5), np.float32), rng, h.fliplr, h.flipud)
        return img, self._item(img, i)["boxes"]

    def _val_item(self, i: int) -> dict[str, Any]:
        img, _ = self.load(i)
        if img is None:
            return {"img": None, "boxes": None, "index": i, "bad": [self.files[i]]}
        return self._item(A.center_crop(img, self.imgsz), i)
