"""`model.predict(...)` / `libreyolo predict`: letterbox, forward, decode + NMS, boxes in original pixels."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from libreyolo.data.augment import letterbox
from libreyolo.data.config import IMG_EXTS
from libreyolo.data.dataset import read_image
from libreyolo.distributed.device import first_device
from libreyolo.errors import DataError
from libreyolo.eval.validator import to_input, to_original
from libreyolo.nn.nms import split_detections


@dataclass
class Results:
    """Detections for one image: boxes (n, 4) xyxy in original pixels, scores (n,), classes (n,)."""

    boxes: torch.Tensor
    scores: torch.Tensor
    classes: torch.Tensor
    names: list[str]
    orig_shape: tuple[int, int]
    path: str | None = None
    image: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.scores)

    def to_list(self) -> list[dict[str, Any]]:
        return [
            {"class": int(c), "name": self.names[int(c)], "score": float(s), "box": [float(v) for v in b]}
            for b, s, c in zip(self.boxes.tolist(), self.scores.tolist(), self.classes.tolist(), strict=True)
        ]


class Predictions(list):
    """The Results of every image that could be read, in source order; `skipped` holds (file, reason) for each
    image that could not be read (each also raised a `UnreadableImageWarning`)."""

    def __init__(self, results: list[Results] = (), skipped: list[tuple[str, str]] | None = None):
        super().__init__(results)
        self.skipped: list[tuple[str, str]] = list(skipped or [])


class UnreadableImageWarning(UserWarning):
    """An image of a predict source could not be read: it is skipped, the others are predicted."""


def to_rgb(arr: np.ndarray) -> np.ndarray:
    """A numpy image in OpenCV's channel order, as cv2.imread gives it: gray (H, W) or (H, W, 1), BGR (H, W, 3) or
    BGRA (H, W, 4), uint8 -> RGB (H, W, 3) uint8, the order the network was trained on."""
    if arr.dtype != np.uint8:
        raise DataError(f"a numpy image must be uint8 (0..255), got {arr.dtype}; convert it, e.g. img.astype(np.uint8)")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2:
        return cv2.cvtColor(arr, cv2.COLOR_GRAY2RGB)
    if arr.ndim == 3 and arr.shape[2] == 3:
        return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    if arr.ndim == 3 and arr.shape[2] == 4:
        return cv2.cvtColor(arr, cv2.COLOR_BGRA2RGB)
    raise DataError(
        f"a numpy image must be (H, W) gray, (H, W, 1), (H, W, 3) BGR or (H, W, 4) BGRA, got shape {arr.shape}"
    )


def _sources(source: Any) -> list[tuple[str | None, np.ndarray | None]]:
    """Paths, folders, lists, numpy arrays (OpenCV's order: gray, BGR or BGRA) or PIL images -> (path, RGB array
    or None: read from the path later)."""
    if isinstance(source, (list, tuple)):
        return [x for s in source for x in _sources(s)]
    if isinstance(source, np.ndarray):
        return [(None, to_rgb(source))]
    if hasattr(source, "convert") and hasattr(source, "size"):  # PIL image
        return [(None, np.asarray(source.convert("RGB")))]
    p = Path(os.fspath(source))
    if p.is_dir():
        return [(str(f), None) for f in sorted(p.iterdir()) if f.suffix.lower() in IMG_EXTS]
    if not p.is_file():
        raise DataError(f"source {p} does not exist (pass an image, a folder of images, or a list)")
    return [(str(p), None)]


def _read(path: str) -> tuple[np.ndarray | None, str]:
    """-> (RGB image, "") or (None, why it cannot be read)."""
    try:
        img = read_image(path)
    except (cv2.error, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    return (img, "") if img is not None else (None, "OpenCV could not decode it")


def read_batches(source: Any, batch: int, results: Predictions) -> Iterator[list[tuple[str | None, np.ndarray]]]:
    """The source's images, read, in batches of up to `batch` (path or None, RGB array). An unreadable image is
    skipped: a warning names it and `results.skipped` lists it; once the batches are done, no readable image at
    all (nothing appended to `results`) is an error."""
    items = _sources(source)
    for start in range(0, len(items), batch):
        ok = []
        for path, arr in items[start : start + batch]:
            img, why = (arr, "") if arr is not None else _read(str(path))
            if img is None:
                results.skipped.append((str(path), why))
                # the warning shows the line that called into libreyolo (past torch's no_grad wrapper too)
                warnings.warn(f"{path}: skipped, the image cannot be read ({why})", UnreadableImageWarning, _caller())
                continue
            ok.append((path, img))
        if ok:
            yield ok
    if items and not results:
        shown = "; ".join(f"{f}: {why}" for f, why in results.skipped[:3])
        more = f" (and {len(results.skipped) - 3} more)" if len(results.skipped) > 3 else ""
        raise DataError(f"none of the {len(items)} images could be read: {shown}{more}")


@torch.no_grad()
def run_predict(
    model: Any,
    source: Any,
    conf: float = 0.25,
    iou: float = 0.7,
    imgsz: int = 640,
    device: str = "auto",
    max_det: int = 300,
    batch: int = 8,
    multi_label: bool = False,
) -> Predictions:
    """An unreadable image is skipped (a warning names it, `Predictions.skipped` lists it) and the others are
    predicted; only when none can be read is it an error."""
    dev = first_device(device)
    net = model.net.to(dev).eval()
    results = Predictions()
    for batch_items in read_batches(source, batch, results):
        imgs, metas = [], []
        for path, img in batch_items:
            lb, r, pad = letterbox(img, imgsz)
            imgs.append(lb)
            metas.append((path, img, r, pad))
        x = to_input(torch.from_numpy(np.stack(imgs)), dev)
        packed = model.family.postprocess(
            net, net(x), (imgsz, imgsz), conf=conf, iou=iou, max_det=max_det, multi_label=multi_label
        )
        # boxes back to original pixels on the device, then one copy of the batch's detections to the host
        lb = torch.tensor(
            [[r, px, py, img.shape[0], img.shape[1]] for _, img, r, (px, py) in metas], dtype=torch.float32, device=dev
        )
        packed = to_original(packed, lb[:, 0], lb[:, 1:3], lb[:, 3:5]).cpu()
        for d, (path, img, _, _) in zip(split_detections(packed, x.shape[0]), metas, strict=True):
            results.append(Results(d["boxes"], d["scores"], d["classes"], model.names, img.shape[:2], path, img))
    return results


def _caller() -> int:
    """The stacklevel (for warnings.warn called where this is called) of the first frame outside libreyolo and torch:
    the user's line, however many of the library's own frames lie between."""
    inside = (os.path.dirname(__file__) + os.sep, os.path.dirname(torch.__file__) + os.sep)
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level
