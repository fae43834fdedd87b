"""Image mosaics with OpenCV: the training batches as the network sees them (train_batchN.jpg), the validation
images with their labels and with the predictions (val_batchN_labels.jpg, val_batchN_pred.jpg), and a classifier's
misclassified images (misclassified.jpg). Images are (H, W, 3) uint8 RGB, as the loaders make them."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np

from libreyolo.atomic import write_bytes

MAX_TILES = 16  # images per mosaic
MAX_SIDE = 1280  # the mosaic's longest side, in pixels
MIN_TILE = 160  # small training images are scaled up to this, so the class names stay readable
PRED_CONF = 0.25  # predictions drawn from this confidence on
_PALETTE = np.array(
    [
        (255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
        (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
        (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255),
        (255, 149, 200), (255, 55, 199),
    ],
    np.uint8,
)  # fmt: skip


def color(cls: int) -> tuple[int, int, int]:
    r, g, b = _PALETTE[cls % len(_PALETTE)]
    return int(r), int(g), int(b)


def write_jpg(img: np.ndarray, path: Path) -> None:
    """RGB uint8 -> a JPEG, through a temporary name (a reader never sees half a file)."""
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise OSError(f"could not encode {path}")
    write_bytes(path, buf.tobytes())


def mosaic(
    images: list[np.ndarray],
    boxes: list[np.ndarray],
    names: list[str],
    titles: list[str] | None = None,
) -> np.ndarray:
    """Up to MAX_TILES images in a square grid, each with its boxes (n, 5) class, x1, y1, x2, y2 in its pixels, or
    (n, 6) with a confidence last (drawn as 'name 0.87'), and an optional title line."""
    images, boxes = images[:MAX_TILES], boxes[:MAX_TILES]
    n = len(images)
    if n == 0:
        return np.full((64, 64, 3), 114, np.uint8)
    h, w = max(i.shape[0] for i in images), max(i.shape[1] for i in images)
    grid = math.ceil(math.sqrt(n))
    rows = math.ceil(n / grid)
    scale = min(MAX_SIDE / (grid * max(h, w)), max(1.0, MIN_TILE / max(h, w)))
    th, tw = round(h * scale), round(w * scale)
    out = np.full((rows * th, grid * tw, 3), 255, np.uint8)
    for k, (img, b) in enumerate(zip(images, boxes)):
        y0, x0 = (k // grid) * th, (k % grid) * tw
        s = min(th / img.shape[0], tw / img.shape[1])
        tile = cv2.resize(img, (round(img.shape[1] * s), round(img.shape[0] * s)), interpolation=cv2.INTER_LINEAR)
        tile = np.ascontiguousarray(tile)
        b = np.asarray(b, np.float64)
        if len(b):  # (n, 5) or (n, 6): the box columns scale with the tile, class and confidence do not
            draw_boxes(tile, b * np.r_[1.0, s, s, s, s, np.ones(b.shape[1] - 5)], names)
        if titles:
            _label(tile, titles[k][:40], 2, 2, (255, 255, 255), (0, 0, 0))
        out[y0 : y0 + tile.shape[0], x0 : x0 + tile.shape[1]] = tile
        cv2.rectangle(out, (x0, y0), (x0 + tw - 1, y0 + th - 1), (255, 255, 255), 2)
    return out


def draw_boxes(img: np.ndarray, boxes: np.ndarray, names: list[str]) -> None:
    """In place: each box (class, x1, y1, x2, y2[, conf]) in its class's colour with its name (and confidence)."""
    thick = max(1, round(min(img.shape[:2]) / 200))
    for row in boxes:
        c = int(row[0])
        x1, y1, x2, y2 = (int(round(v)) for v in row[1:5])
        col = color(c)
        cv2.rectangle(img, (x1, y1), (x2, y2), col, thick)
        text = names[c] if 0 <= c < len(names) else str(c)
        if len(row) > 5:
            text += f" {row[5]:.2f}"
        _label(img, text, x1, max(y1 - 1, 0), (255, 255, 255), col)


def _label(img: np.ndarray, text: str, x: int, y: int, fg: tuple[int, int, int], bg: tuple[int, int, int]) -> None:
    font, fs = cv2.FONT_HERSHEY_SIMPLEX, 0.35
    (w, h), base = cv2.getTextSize(text, font, fs, 1)
    y = max(y, h + base)
    cv2.rectangle(img, (x, y - h - base), (x + w, y), bg, -1)
    cv2.putText(img, text, (x, y - base), font, fs, fg, 1, cv2.LINE_AA)
