"""Image decoding: one function turns a file into the training-size image, whatever cache mode is on.

Every path (no cache, the RAM cache, the disk cache) calls `load_resized`, so a batch is byte-identical
whichever mode is used. OpenCV is the decoder: on the shapes JPEGs it matched torchvision.io and beat PIL
(docs/data-pipeline.md), and for a JPEG at least twice as large as needed it decodes at 1/2, 1/4 or 1/8
scale inside libjpeg (IMREAD_REDUCED_*), which skips most of the inverse DCT work.

OpenCV applies the EXIF orientation (JPEG, PNG, WebP) as Pillow's `ImageOps.exif_transpose` does, so a phone photo
decodes as displayed; the label scan records that displayed size (labels.displayed_size), and the validator places
ground truth with it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from libreyolo.data.augment import resize_long_side
from libreyolo.data.cpus import cpu_count

_REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
_JPEG = (".jpg", ".jpeg", ".jpe", ".jfif")


def read_image(path: str) -> np.ndarray | None:
    """Decode at full size to RGB uint8, or None if the file cannot be decoded."""
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        return None
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def reduction(long_side: int, imgsz: int) -> int:
    """The largest of 1, 2, 4, 8 that keeps the decoded long side at least imgsz (so it is only ever shrunk)."""
    k = 1
    while k < 8 and long_side >= 2 * k * imgsz:
        k *= 2
    return k


def load_resized(path: str, imgsz: int, long_side: int | None = None) -> np.ndarray | None:
    """RGB uint8 with its long side resized to imgsz, or None if unreadable.

    `long_side` is the file's size from the label scan; with it a large JPEG is decoded at reduced scale."""
    k = reduction(long_side, imgsz) if long_side and path.lower().endswith(_JPEG) else 1
    img = cv2.imread(path, _REDUCED[k] if k > 1 else cv2.IMREAD_COLOR)
    if img is None:
        return None
    return resize_long_side(cv2.cvtColor(img, cv2.COLOR_BGR2RGB), imgsz)


def slot_bytes(shape: tuple[int, int], imgsz: int) -> int:
    """An upper bound of the bytes `load_resized` returns for an image of (h, w): the short side may differ
    by a pixel with the reduced decode's rounding, and by orientation (EXIF), so leave two rows spare."""
    h, w = shape
    lo, hi = sorted((h, w))
    short = min(imgsz, -(-lo * imgsz // hi) + 2)
    return imgsz * short * 3


def decode_all(
    files: list[str],
    long_sides: list[int],
    imgsz: int,
    store: Callable[[int, np.ndarray], None],
    desc: str,
    threads: int | None = None,
    progress: bool = True,
) -> list[tuple[str, str]]:
    """Decode files[i] for every i in parallel threads (OpenCV releases the GIL) and hand each image to
    store(i, image), with a progress bar. -> (file, reason) for each file that could not be decoded."""
    threads = threads or cpu_count()
    # each thread decodes one image: OpenCV's own thread pool on top would only oversubscribe the cores.
    # 0 (run sequentially), not 1: setNumThreads(1) hangs in a process forked from one whose OpenCV pool
    # had started (OpenCV 5.0, pthreads backend), and DDP ranks or tests may be such processes.
    cv_threads = cv2.getNumThreads()
    cv2.setNumThreads(0)
    bad: list[tuple[str, str]] = []

    def one(i: int) -> None:
        img = load_resized(files[i], imgsz, long_sides[i])
        if img is None:
            bad.append((files[i], "OpenCV could not decode it"))
        else:
            store(i, img)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    try:
        with (
            ThreadPoolExecutor(threads) as pool,
            Progress(*columns, console=Console(stderr=True), disable=not progress) as bar,
        ):
            task = bar.add_task(desc, total=len(files))
            for _ in pool.map(one, range(len(files))):
                bar.advance(task)
    finally:
        cv2.setNumThreads(cv_threads)
    return sorted(bad)
