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

from libreyolo.data.augment import fitted_size, letterbox
from libreyolo.data.dataset import read_image
from libreyolo.data.labels import JPEG_SUFFIXES, truncated_jpeg
from libreyolo.distributed.device import first_device
from libreyolo.errors import DataError
from libreyolo.eval.validator import to_input, to_original
from libreyolo.families.built import BuiltModel
from libreyolo.nn.nms import check_nms, split_detections
from libreyolo.sources import open_source


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


class PredictStream(Iterator[Any]):
    """stream=True: the results one frame at a time, read, predicted and handed on as the caller asks for them;
    `skipped` fills as unreadable images are met. `close()` (or the end) releases the video being read."""

    def __init__(self, results: Iterator[Any], skipped: list[tuple[str, str]]):
        self._results, self.skipped = results, skipped

    def __next__(self) -> Any:
        return next(self._results)

    def close(self) -> None:
        close = getattr(self._results, "close", None)
        if close is not None:
            close()


def run_or_stream(results: Iterator[Any], into: Predictions, stream: bool) -> Predictions | PredictStream:
    """Every result in a list (`into`, whose skipped the reading fills), or, with stream, an iterator of them."""
    if stream:
        return PredictStream(results, into.skipped)
    for r in results:
        into.append(r)
    return into


class UnreadableImageWarning(UserWarning):
    """An image of a predict source could not be read: it is skipped, the others are predicted."""


class TruncatedImageWarning(UserWarning):
    """A JPEG of a predict source is cut short: it is predicted on the part that could be decoded (OpenCV fills the
    rest grey, and libjpeg's own 'Premature end of JPEG file' names no file)."""


def _read(path: str) -> tuple[np.ndarray | None, str]:
    """-> (RGB image, "") or (None, why it cannot be read). A truncated JPEG is read, with a warning naming it."""
    try:
        img = read_image(path)
    except (cv2.error, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    if img is None:
        return None, "OpenCV could not decode it"
    if path.lower().endswith(JPEG_SUFFIXES) and (cut := truncated_jpeg(Path(path))):
        warnings.warn(
            f"{path}: {cut}; predicted on the part that could be decoded (the rest is grey)",
            TruncatedImageWarning,
            _caller(),
        )
    return img, ""


def read_batches(source: Any, batch: int, results: Predictions) -> Iterator[list[tuple[str | None, np.ndarray]]]:
    """The source's images and video frames (libreyolo.sources), read as the batches are asked for, in batches of up
    to `batch` (path or None, RGB array); a live stream's in batches of 1. An unreadable image is skipped: a warning
    names it and `results.skipped` lists it; once the batches are done, no readable image at all is an error."""
    src = open_source(source)
    seen = read = 0
    for items in src.chunks(1 if src.live else batch):
        ok = []
        seen += len(items)
        for path, arr in items:
            img, why = (arr, "") if arr is not None else _read(str(path))
            if img is None:
                results.skipped.append((str(path), why))
                # the warning shows the line that called into libreyolo (past torch's no_grad wrapper too)
                warnings.warn(f"{path}: skipped, the image cannot be read ({why})", UnreadableImageWarning, _caller())
                continue
            ok.append((path, img))
        if ok:
            read += len(ok)
            yield ok
    if seen and not read:
        shown = "; ".join(f"{f}: {why}" for f, why in results.skipped[:3])
        more = f" (and {len(results.skipped) - 3} more)" if len(results.skipped) > 3 else ""
        raise DataError(f"none of the {seen} images could be read: {shown}{more}")


def run_predict(
    model: BuiltModel,
    source: Any,
    conf: float = 0.25,
    iou: float = 0.7,
    imgsz: int = 640,
    device: str = "auto",
    max_det: int = 300,
    batch: int = 8,
    multi_label: bool = False,
    stream: bool = False,
) -> Predictions | PredictStream:
    """An unreadable image is skipped (a warning names it, `Predictions.skipped` lists it) and the others are
    predicted; only when none can be read is it an error. stream: an iterator of the results instead of a list."""
    results = Predictions()
    kw = {"conf": conf, "iou": iou, "imgsz": imgsz, "max_det": max_det, "batch": batch, "multi_label": multi_label}
    return run_or_stream(_detect(model, source, device, results, **kw), results, stream)


@torch.no_grad()
def _detect(
    model: BuiltModel,
    source: Any,
    device: str,
    results: Predictions,
    conf: float,
    iou: float,
    imgsz: int,
    max_det: int,
    batch: int,
    multi_label: bool,
) -> Iterator[Results]:
    dev = first_device(device)
    check_nms(dev)  # a torchvision built for another torch: one error naming both versions, not a traceback
    net = model.net.to(dev).eval()
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
        lb = torch.tensor([_letterboxed(img, imgsz, pad) for _, img, _, pad in metas], dtype=torch.float32, device=dev)
        packed = to_original(packed, lb[:, 0:2], lb[:, 2:4], lb[:, 4:6]).cpu()
        for d, (path, img, _, _) in zip(split_detections(packed, x.shape[0]), metas, strict=True):
            yield Results(d["boxes"], d["scores"], d["classes"], model.names, img.shape[:2], path, img)


def _letterboxed(img: np.ndarray, imgsz: int, pad: tuple[int, int]) -> list[float]:
    """[scale x, scale y, pad x, pad y, height, width] of an image's letterbox: each axis's own scale, as the sides
    were rounded (fitted_size), so a 4000 x 20 image's boxes map back onto it."""
    h, w = img.shape[:2]
    nh, nw = fitted_size(h, w, imgsz)
    return [nw / w, nh / h, pad[0], pad[1], h, w]


def _caller() -> int:
    """The stacklevel (for warnings.warn called where this is called) of the first frame outside libreyolo and torch:
    the user's line, however many of the library's own frames lie between."""
    inside = (os.path.dirname(__file__) + os.sep, os.path.dirname(torch.__file__) + os.sep)
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level
