"""What `predict` reads: images, videos, folders of both, globs, cameras and network streams, one frame at a time.

`open_source(source)` turns what the user passed into a `Source`: iterating it yields (path or None, RGB uint8 array
or None) in order, where None means "an image file, read it from the path" (predict.py reads and reports those).
Videos are decoded by OpenCV frame by frame, so a 1,000-frame video is never in memory whole; a camera index ("0")
or an rtsp://, rtmp://, http(s):// URL is a live stream of unknown length. `outputs.py` writes what predict saves."""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from libreyolo.data.config import IMG_EXTS, walk_files
from libreyolo.errors import DataError

VIDEO_EXTS = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".ts")
STREAM_SCHEMES = ("rtsp://", "rtmp://", "http://", "https://", "udp://", "tcp://")
# what OpenCV reports for a stream that does not know its frame rate; the saved video plays at this rate
DEFAULT_FPS = 30.0
Item = tuple[str | None, np.ndarray | None]


@dataclass(frozen=True)
class VideoInfo:
    """A video or stream as OpenCV opened it: frame rate, frame size, frame count (None for a live stream)."""

    fps: float
    width: int
    height: int
    frames: int | None


@dataclass(frozen=True)
class _Entry:
    kind: str  # image | array | video | camera | url
    path: str | None = None
    array: np.ndarray | None = None
    camera: int | None = None


class Source:
    """An opened predict source. Iterate it for its frames in order; `videos` holds each video's `VideoInfo` from
    the moment it is opened (before its first frame), `total` the frames a progress bar can expect (None when a
    live stream is among them), `live` whether one is."""

    def __init__(self, entries: list[_Entry]):
        self.entries = entries
        self.videos: dict[str, VideoInfo] = {}
        self.live = any(e.kind in ("camera", "url") for e in entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def total(self) -> int | None:
        if self.live:
            return None
        return sum(_frame_count(e.path) if e.kind == "video" and e.path else 1 for e in self.entries)

    def __iter__(self) -> Iterator[Item]:
        for e in self.entries:
            if e.kind == "image":
                yield e.path, None
            elif e.kind == "array":
                yield None, e.array
            else:
                yield from self._frames(e)

    def chunks(self, size: int) -> Iterator[list[Item]]:
        """The frames in lists of up to `size`, read only as each list is asked for."""
        it = iter(self)
        while chunk := list(itertools.islice(it, size)):
            yield chunk

    def _frames(self, e: _Entry) -> Iterator[Item]:
        name = str(e.path)
        cap = cv2.VideoCapture(e.camera if e.camera is not None else str(e.path))
        try:
            if not cap.isOpened():
                if e.kind == "video":  # a file that is not a video: predict skips it as unreadable, like an image
                    yield name, None
                    return
                raise DataError(f"source {name}: OpenCV could not open the {_what(e)}; check the index or URL")
            count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            self.videos[name] = VideoInfo(
                fps=cap.get(cv2.CAP_PROP_FPS) or DEFAULT_FPS,
                width=int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
                height=int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                frames=count if e.kind == "video" and count > 0 else None,
            )
            while True:
                ok, frame = cap.read()
                if not ok:  # the end of a file; for a live stream, the camera or server stopped sending
                    return
                yield name, to_rgb(frame)
        finally:
            cap.release()


def open_source(source: Any) -> Source:
    """A path (image or video), a folder (its images and videos, in sub-folders and linked folders too, sorted by
    path), a glob ("clips/*.mp4", "**/*.jpg"), a camera index (0 or "0"), a stream URL, a numpy array (OpenCV's
    order: gray, BGR or BGRA), a PIL image, or a list of these -> a Source. An opened Source passes through
    unchanged."""
    if isinstance(source, Source):
        return source
    return Source(_entries(source))


def is_video(path: str | None) -> bool:
    return path is not None and Path(path).suffix.lower() in VIDEO_EXTS


def _entries(source: Any) -> list[_Entry]:
    if isinstance(source, (list, tuple)):
        return [e for s in source for e in _entries(s)]
    if isinstance(source, np.ndarray):
        return [_Entry("array", array=to_rgb(source))]
    if hasattr(source, "convert") and hasattr(source, "size"):  # PIL image
        return [_Entry("array", array=np.asarray(source.convert("RGB")))]
    if isinstance(source, int) and not isinstance(source, bool):
        return [_Entry("camera", path=f"camera{source}", camera=source)]
    text = str(os.fspath(source))
    if text.lower().startswith(STREAM_SCHEMES):
        return [_Entry("url", path=text)]
    p = Path(text)
    if p.is_dir():
        return [_file(f) for f in walk_files(p, (*IMG_EXTS, *VIDEO_EXTS))]  # sub-folders and linked ones too
    if p.is_file():
        return [_file(p)]
    if text.isdigit():
        return [_Entry("camera", path=f"camera{text}", camera=int(text))]
    if glob.has_magic(text):
        found = sorted(Path(f) for f in glob.glob(text, recursive=True))
        files = [_file(f) for f in found if f.is_file() and f.suffix.lower() in (*IMG_EXTS, *VIDEO_EXTS)]
        if not files:
            raise DataError(f"source {text}: the pattern matches no image or video ({', '.join(VIDEO_EXTS)}, ...)")
        return files
    raise DataError(
        f"source {p} does not exist (pass an image, a video, a folder, a glob, a camera index such as 0, "
        "an rtsp:// or http:// URL, or a list)"
    )


def _file(p: Path) -> _Entry:
    # any other suffix is tried as an image: predict reports it as unreadable if it is not one
    return _Entry("video" if p.suffix.lower() in VIDEO_EXTS else "image", path=str(p))


def _frame_count(path: str) -> int:
    cap = cv2.VideoCapture(path)
    try:
        return max(int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), 0) if cap.isOpened() else 1
    finally:
        cap.release()


def _what(e: _Entry) -> str:
    return "camera" if e.kind == "camera" else "stream"


def stream_name(name: str) -> str:
    """A file name for what a camera or URL recorded: camera0, or the URL's last path part."""
    if not name.lower().startswith(STREAM_SCHEMES):
        return Path(name).stem
    tail = name.rstrip("/").rsplit("/", 1)[-1] or "stream"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", Path(tail).stem) or "stream"


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
