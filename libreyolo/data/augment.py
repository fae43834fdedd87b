"""Augmentations on uint8 RGB images (H, W, 3) with boxes as (n, 5) float32 rows: class, x1, y1, x2, y2 pixels.

Every random draw comes from the numpy Generator passed in, so a sample is a pure function of
(seed, epoch, index): the same batches with 0 or N workers, and after a resume."""

from __future__ import annotations

import math
from collections.abc import Callable

import cv2
import numpy as np

PAD = 114


def resize_long_side(img: np.ndarray, imgsz: int) -> np.ndarray:
    h, w = img.shape[:2]
    r = imgsz / max(h, w)
    if r == 1:
        return img
    nh, nw = fitted_size(h, w, imgsz)
    return cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)


def fitted_size(h: int, w: int, imgsz: int) -> tuple[int, int]:
    """(height, width) of an h x w image resized so its long side is imgsz: each side rounded on its own (the short
    side keeps at least one pixel), so the two sides' scales differ (20 px of a 4000 x 20 image at imgsz 96 become
    1 px, a scale of 0.05 where the long side's is 0.024): boxes map back with each axis's own scale."""
    r = imgsz / max(h, w)
    if r == 1:
        return h, w
    return max(1, round(h * r)), max(1, round(w * r))


def letterbox(img: np.ndarray, imgsz: int) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Fit the long side to imgsz and pad to a square; -> image, scale, (pad_x, pad_y). The short side keeps at
    least one pixel (a 4000x20 image at imgsz 64)."""
    h, w = img.shape[:2]
    r = imgsz / max(h, w)
    img = resize_long_side(img, imgsz)
    nh, nw = img.shape[:2]
    px, py = (imgsz - nw) // 2, (imgsz - nh) // 2
    out = cv2.copyMakeBorder(img, py, imgsz - nh - py, px, imgsz - nw - px, cv2.BORDER_CONSTANT, value=(PAD, PAD, PAD))
    return out, r, (px, py)


def mosaic4(
    load: Callable[[int], tuple[np.ndarray, np.ndarray]], indices: list[int], imgsz: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Four images around a random centre on a 2*imgsz canvas; the affine step crops it back to imgsz."""
    s = imgsz
    xc, yc = (int(rng.uniform(s * 0.5, s * 1.5)) for _ in range(2))
    canvas = np.full((2 * s, 2 * s, 3), PAD, np.uint8)
    all_boxes = []
    for k, i in enumerate(indices):
        img, boxes = load(i)
        h, w = img.shape[:2]
        if k == 0:  # top-left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
        elif k == 1:  # top-right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
            x1b, y1b = 0, h - (y2a - y1a)
        elif k == 2:  # bottom-left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
            x1b, y1b = w - (x2a - x1a), 0
        else:  # bottom-right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
            x1b, y1b = 0, 0
        canvas[y1a:y2a, x1a:x2a] = img[y1b : y1b + (y2a - y1a), x1b : x1b + (x2a - x1a)]
        b = boxes.copy()
        b[:, [1, 3]] += x1a - x1b
        b[:, [2, 4]] += y1a - y1b
        all_boxes.append(b)
    boxes = np.concatenate(all_boxes, 0)
    boxes[:, 1:] = boxes[:, 1:].clip(0, 2 * s)
    return canvas, boxes


def random_affine(
    img: np.ndarray,
    boxes: np.ndarray,
    rng: np.random.Generator,
    out_size: int,
    degrees: float = 0.0,
    translate: float = 0.1,
    scale: float = 0.5,
    shear: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rotate/scale/shear about the image centre, translate, and crop to out_size x out_size."""
    h, w = img.shape[:2]
    C = np.eye(3)
    C[0, 2], C[1, 2] = -w / 2, -h / 2
    R = np.eye(3)
    a = rng.uniform(-degrees, degrees)
    sc = rng.uniform(1 - scale, 1 + scale)
    R[:2] = cv2.getRotationMatrix2D((0, 0), a, sc)
    S = np.eye(3)
    S[0, 1] = math.tan(math.radians(rng.uniform(-shear, shear)))
    S[1, 0] = math.tan(math.radians(rng.uniform(-shear, shear)))
    T = np.eye(3)
    T[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_size
    T[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_size
    M = T @ S @ R @ C
    out = cv2.warpAffine(img, M[:2], (out_size, out_size), borderValue=(PAD, PAD, PAD))
    if len(boxes):
        n = len(boxes)
        corners = np.ones((n * 4, 3))
        corners[:, :2] = boxes[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n * 4, 2)
        xy = (corners @ M.T)[:, :2].reshape(n, 8)
        new = np.stack([xy[:, 0::2].min(1), xy[:, 1::2].min(1), xy[:, 0::2].max(1), xy[:, 1::2].max(1)], 1)
        new = new.clip(0, out_size)
        keep = _box_candidates(boxes[:, 1:5] * sc, new)
        boxes = np.concatenate([boxes[keep, :1], new[keep]], 1).astype(np.float32)
    return out, boxes


def _box_candidates(
    before: np.ndarray, after: np.ndarray, min_px: float = 2.0, min_area: float = 0.1, max_ar: float = 100.0
) -> np.ndarray:
    """Keep boxes still at least 2 px wide/high, with 10% of their (scaled) area left and sane aspect."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    ar = np.maximum(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16))
    return (w2 > min_px) & (h2 > min_px) & (w2 * h2 / (w1 * h1 + 1e-16) > min_area) & (ar < max_ar)


def augment_hsv(img: np.ndarray, rng: np.random.Generator, hgain: float, sgain: float, vgain: float) -> None:
    """Random hue/saturation/value gains through lookup tables, in place."""
    if not (hgain or sgain or vgain):
        return
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    x = np.arange(256, dtype=np.float32)
    lut_h = ((x * r[0]) % 180).astype(np.uint8)
    lut_s = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut_v = np.clip(x * r[2], 0, 255).astype(np.uint8)
    # one 3-channel table maps each channel through its own row: no split/merge copies (same bytes)
    hsv = cv2.LUT(cv2.cvtColor(img, cv2.COLOR_RGB2HSV), np.stack([lut_h, lut_s, lut_v], 1).reshape(256, 1, 3))
    cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=img)


def flip(img: np.ndarray, boxes: np.ndarray, rng: np.random.Generator, p_lr: float, p_ud: float) -> np.ndarray:
    """Random horizontal/vertical flips; boxes are updated in place, the (possibly new) image is returned."""
    # cv2.flip: the same bytes as a contiguous copy of img[:, ::-1], about 10x faster at 640 px
    h, w = img.shape[:2]
    if p_lr and rng.random() < p_lr:
        img = cv2.flip(img, 1)
        boxes[:, [1, 3]] = w - boxes[:, [3, 1]]
    if p_ud and rng.random() < p_ud:
        img = cv2.flip(img, 0)
        boxes[:, [2, 4]] = h - boxes[:, [4, 2]]
    return img


def center_crop(img: np.ndarray, size: int) -> np.ndarray:
    """Classification's validation view: the short side resized to size, then the centre size x size."""
    h, w = img.shape[:2]
    r = size / min(h, w)
    if r != 1:
        interpolation = cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR
        img = cv2.resize(img, (max(size, round(w * r)), max(size, round(h * r))), interpolation=interpolation)
    h, w = img.shape[:2]
    y, x = (h - size) // 2, (w - size) // 2
    return np.ascontiguousarray(img[y : y + size, x : x + size])


def random_resized_crop(
    img: np.ndarray, rng: np.random.Generator, size: int, min_area: float, ratio: tuple[float, float] = (0.75, 4 / 3)
) -> np.ndarray:
    """Classification's training view (torchvision's RandomResizedCrop): a crop of min_area..1 of the image's area
    and aspect ratio log-uniform in `ratio`, resized to size x size; the centre crop if ten draws do not fit."""
    h, w = img.shape[:2]
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        area = h * w * rng.uniform(min_area, 1.0)
        ar = math.exp(rng.uniform(lo, hi))
        cw, ch = round(math.sqrt(area * ar)), round(math.sqrt(area / ar))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return cv2.resize(img[y : y + ch, x : x + cw], (size, size), interpolation=cv2.INTER_LINEAR)
    return center_crop(img, size)
