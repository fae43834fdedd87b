"""The detection dataset: decoded uint8 images and pixel boxes, augmented per (seed, epoch, index)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from libreyolo.data import augment as A
from libreyolo.data.decode import load_resized, read_image  # noqa: F401  (read_image: used by predict)
from libreyolo.data.labels import LabelSet


@dataclass
class AugmentConfig:
    mosaic: float = 1.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4

    @classmethod
    def from_config(cls, cfg: Any) -> AugmentConfig:
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__})


class YOLODataset(Dataset):
    """Index with an int (validation: letterbox only) or with (index, epoch, mosaic) from the train sampler."""

    def __init__(
        self,
        labels: LabelSet,
        imgsz: int,
        augment: bool,
        hyp: AugmentConfig | None = None,
        seed: int = 0,
        image_source: Any = None,
    ):
        self.labels, self.imgsz, self.augment, self.seed = labels, imgsz, augment, seed
        self.hyp = hyp or AugmentConfig()
        self.files = [str(f) for f in labels.files]
        # optional RAM/disk cache of resized images (see data/cache.py); None reads files
        self.image_source = image_source
        self._ground_truth: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.files)

    def ground_truth(self) -> tuple[np.ndarray, np.ndarray]:
        """Every image's boxes in original pixels, for COCO evaluation, made once per dataset (not per
        validation): rows (n, 6) image index, class, x1, y1, x2, y2 (a 7th column, iscrowd, where the dataset has
        crowd boxes) and sizes (I, 2) height, width, float64."""
        if self._ground_truth is None:
            sizes = np.asarray(self.labels.shapes, np.float32).reshape(-1, 2)
            rows = _pixel_rows(self.labels.labels, sizes)
            if any(len(c) for c in self.labels.crowd):  # a 7th column, 1 for a crowd box (COCO's iscrowd)
                crowd = _pixel_rows(self.labels.crowd, sizes)
                rows = np.vstack(
                    [np.column_stack([rows, np.zeros(len(rows))]), np.column_stack([crowd, np.ones(len(crowd))])]
                )
            self._ground_truth = (rows, sizes.astype(np.float64))
        return self._ground_truth

    def load(self, i: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Image resized so its long side is imgsz, and its boxes (class, x1, y1, x2, y2) in those pixels."""
        img = self.image_source.get(i) if self.image_source is not None else None
        if img is None:
            img = load_resized(self.files[i], self.imgsz, max(self.labels.shapes[i]))
            if img is None:
                return None, np.zeros((0, 5), np.float32)
            if self.image_source is not None:  # a cache filled as images are first decoded (cache=auto) keeps it
                self.image_source.put(i, img)
        h, w = img.shape[:2]
        lab = self.labels.labels[i]
        boxes = np.empty((len(lab), 5), np.float32)
        boxes[:, 0] = lab[:, 0]
        boxes[:, 1] = (lab[:, 1] - lab[:, 3] / 2) * w
        boxes[:, 2] = (lab[:, 2] - lab[:, 4] / 2) * h
        boxes[:, 3] = (lab[:, 1] + lab[:, 3] / 2) * w
        boxes[:, 4] = (lab[:, 2] + lab[:, 4] / 2) * h
        return img, boxes

    def __getitem__(self, key: Any) -> dict[str, Any]:
        if isinstance(key, tuple):
            index, epoch, mosaic = key
        else:
            index, epoch, mosaic = int(key), 0, False
        if not self.augment:
            return self._val_item(index)
        bad: list[str] = []
        n = len(self)
        for attempt in range(min(n, 10)):  # a corrupt image is replaced by its neighbour, and reported
            i = (index + attempt) % n
            rng = np.random.default_rng((self.seed, epoch, i))
            try:
                img, boxes = self._train_item(i, rng, mosaic)
            except _Unreadable as e:
                bad.append(e.path)
                continue
            return {"img": img, "boxes": boxes, "index": i, "bad": bad}
        raise RuntimeError(f"10 consecutive images could not be decoded, starting at {self.files[index]}")

    def _checked_load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        img, boxes = self.load(i)
        if img is None:
            raise _Unreadable(self.files[i])
        return img, boxes

    def _train_item(self, i: int, rng: np.random.Generator, mosaic: bool) -> tuple[np.ndarray, np.ndarray]:
        h = self.hyp
        if mosaic and h.mosaic > 0 and rng.random() < h.mosaic:
            others = rng.integers(0, len(self), 3).tolist()
            img, boxes = A.mosaic4(self._checked_load, [i, *others], self.imgsz, rng)
        else:
            img, boxes = self._checked_load(i)
            img, r, (px, py) = A.letterbox(img, self.imgsz)
            boxes[:, 1:] = boxes[:, 1:] * r + (px, py, px, py)
        img, boxes = A.random_affine(img, boxes, rng, self.imgsz, h.degrees, h.translate, h.scale, h.shear)
        A.augment_hsv(img, rng, h.hsv_h, h.hsv_s, h.hsv_v)
        img = A.flip(img, boxes, rng, h.fliplr, h.flipud)
        return img, boxes

    def _val_item(self, i: int) -> dict[str, Any]:
        img, boxes = self.load(i)
        if img is None:
            return {"img": None, "boxes": None, "index": i, "bad": [self.files[i]]}
        h1, w1 = img.shape[:2]
        resized_long = max(h1, w1)
        img, r, (px, py) = A.letterbox(img, self.imgsz)
        nh, nw = A.fitted_size(h1, w1, self.imgsz)  # the image inside the letterbox
        boxes[:, 1:] = boxes[:, 1:] * (nw / w1, nh / h1, nw / w1, nh / h1) + (px, py, px, py)
        h0, w0 = self.labels.shapes[i]
        # original pixels -> letterboxed pixels is x * scale + pad, each axis with its own scale (fitted_size); the
        # predictions are mapped back with the inverse. "scale" is the long side's, for a drawing of the boxes
        scale = r * resized_long / max(h0, w0)
        return {
            "img": img,
            "boxes": boxes,
            "index": i,
            "bad": [],
            "scale": scale,
            "scale_xy": (nw / w0, nh / h0),
            "pad": (px, py),
            "shape": (h0, w0),
        }


def _pixel_rows(labels: list[np.ndarray], sizes: np.ndarray) -> np.ndarray:
    """Per-image normalised (n, 5) class, cx, cy, w, h -> rows (N, 6) image index, class, x1, y1, x2, y2 in pixels."""
    lab = np.concatenate(labels).reshape(-1, 5) if labels else np.zeros((0, 5), np.float32)
    img = np.repeat(np.arange(len(labels)), [len(x) for x in labels])
    wh = sizes[img][:, ::-1]
    xyxy = np.concatenate([lab[:, 1:3] - lab[:, 3:5] / 2, lab[:, 1:3] + lab[:, 3:5] / 2], 1) * np.tile(wh, 2)  # float32
    return np.column_stack([img, lab[:, 0], xyxy]).astype(np.float64)


class _Unreadable(Exception):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


def capacity(n: int, minimum: int = 4) -> int:
    """Target slots per image for a batch whose fullest image has n boxes: n rounded up to a multiple of 8 (at
    least `minimum`), so shapes repeat from batch to batch. Not a power of two: the assigner's (B, M, A) tensors
    grow with the slots, and 24 boxes in 32 slots (or a mosaic's 150 in 256) would be a third (or 70%) more work
    and memory for nothing. Monotonic, so a capacity_bound covers every batch's own capacity."""
    return minimum if n <= minimum else -(-n // 8) * 8


def capacity_bound(labels: list[np.ndarray], mosaic: float) -> int:
    """The most target slots per image any training batch can need: a mosaic holds four images' boxes (crops
    only remove boxes), a plain image its own: the whole-step graph's capacity, known before its first capture
    (engine/passes.target_capacity), so a run captures once and DDP's ranks agree on it."""
    counts = sorted((len(x) for x in labels), reverse=True)
    return capacity(sum(counts[:4]) if mosaic > 0 else max(counts, default=0))


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """-> img (B, H, W, 3) uint8, targets (B, M, 5) float32, mask (B, M) bool, index (B,), and for validation
    scale_xy (B, 2) x, y, pad (B, 2) x, y and shape (B, 2) original height, width (float32): letterboxed = original
    * scale_xy + pad per axis; scale (B,) is the long side's."""
    bad = [p for s in samples for p in s["bad"]]
    samples = [s for s in samples if s["img"] is not None]
    B = len(samples)
    counts = [len(s["boxes"]) for s in samples]
    M = capacity(max(counts, default=0))
    targets = np.zeros((B, M, 5), np.float32)
    mask = np.zeros((B, M), bool)
    for k, (s, n) in enumerate(zip(samples, counts)):
        targets[k, :n] = s["boxes"]
        mask[k, :n] = True
    batch = {
        "img": torch.from_numpy(np.stack([s["img"] for s in samples]))
        if B
        else torch.zeros(0, 0, 0, 3, dtype=torch.uint8),
        "targets": torch.from_numpy(targets),
        "mask": torch.from_numpy(mask),
        "index": torch.tensor([s["index"] for s in samples], dtype=torch.long),
        "bad": bad,
    }
    if samples and "scale" in samples[0]:
        batch["scale"] = torch.tensor([s["scale"] for s in samples], dtype=torch.float32)
        batch["scale_xy"] = torch.tensor([s["scale_xy"] for s in samples], dtype=torch.float32)
        batch["pad"] = torch.tensor([s["pad"] for s in samples], dtype=torch.float32)
        batch["shape"] = torch.tensor([s["shape"] for s in samples], dtype=torch.float32)
    return batch
