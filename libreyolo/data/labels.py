"""Scan and check YOLO labels once; keep the result in a label cache so later runs start at once.

Each bad image is skipped, and each bad label line dropped, counted and reported by name (with the line and the
reason); it is never fatal unless nothing usable is left. Segment lines (`class x1 y1 x2 y2 x3 y3 ...`) are used
as their polygon's bounding box; image sizes are recorded as displayed, after the EXIF orientation."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from libreyolo.atomic import written_whole
from libreyolo.data.config import label_path

CACHE_VERSION = 2  # 2: shapes as displayed (EXIF orientation), dropped lines, polygon count


@dataclass
class LabelSet:
    files: list[Path]
    labels: list[np.ndarray]  # per image (n, 5) float32: class, cx, cy, w, h (normalised)
    shapes: list[tuple[int, int]]  # per image (height, width) as displayed, after its EXIF orientation
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    backgrounds: int = 0  # images without a label file or with an empty one
    bad_lines: list[tuple[str, str]] = field(default_factory=list)  # ("label.txt:line", reason), line dropped
    polygons: int = 0  # segment lines (class x1 y1 x2 y2 ...) used as their bounding boxes
    # per image (size, mtime_ns) as stat'ed for this scan, or None if it could not be; the image caches key
    # and check their entries with these instead of stat'ing every image again
    stamps: list[tuple[int, int] | None] = field(default_factory=list)
    # per image its crowd boxes (COCO's iscrowd; class, cx, cy, w, h), or empty: never trained on, and a detection
    # on one is neither right nor wrong in validation (eval/coco.py), as in COCO's evaluation
    crowd: list[np.ndarray] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def boxes(self) -> int:
        return sum(len(x) for x in self.labels)


_ORIENTATION = 0x0112  # the EXIF tag; values 5-8 turn the image a quarter, so width and height swap
_JPEG_EOI = b"\xff\xd9"


def displayed_size(im: Image.Image) -> tuple[int, int]:
    """(width, height) of the image as shown, after its EXIF orientation (as `ImageOps.exif_transpose` and
    OpenCV's decoder apply it). Only header data is read: a PNG whose EXIF chunk follows the pixels (rare) is
    not read to its end for it."""
    w, h = im.size
    if im.format == "PNG" and "exif" not in im.info:
        return w, h
    try:
        orientation = im.getexif().get(_ORIENTATION, 1)
    except Exception:  # a broken EXIF block: the pixels may still be fine, and decoders ignore it too
        return w, h
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")


def truncated_jpeg(image: Path) -> str | None:
    """Why a JPEG is cut short, or None. A JPEG ends with the end-of-image marker; a file that does not end with
    it is decoded in full once (rare: some cameras append bytes after the marker) to tell trailing data from a
    truncation, which OpenCV would decode as grey fill with a warning naming no file."""
    with open(image, "rb") as f:
        f.seek(-2, os.SEEK_END)
        if f.read(2) == _JPEG_EOI:
            return None
    try:
        with Image.open(image) as im:
            im.load()
    except Exception as e:
        return f"truncated JPEG: no end-of-image marker ({type(e).__name__}: {e})"
    return None


@dataclass
class _Checked:
    labels: np.ndarray | None = None
    shape: tuple[int, int] | None = None  # (height, width) as displayed
    error: str | None = None  # why the image is skipped
    background: bool = False
    bad_lines: list[tuple[str, str]] = field(default_factory=list)  # ("label.txt:line", reason) dropped
    polygons: int = 0  # segment lines used as their bounding boxes


def _check_one(image: Path, nc: int) -> _Checked:
    try:
        with Image.open(image) as im:
            w, h = displayed_size(im)
            jpeg = im.format == "JPEG"
            im.verify()
        why = truncated_jpeg(image) if jpeg else None
    except Exception as e:  # PIL raises many types for broken files
        return _Checked(error=f"unreadable image ({type(e).__name__}: {e})")
    if why is not None:
        return _Checked(error=why)
    if w < 2 or h < 2:
        return _Checked(error=f"image is {w}x{h} pixels")
    lp = label_path(image)
    if not lp.is_file():
        return _Checked(np.zeros((0, 5), np.float32), (h, w), background=True)
    out = _Checked(shape=(h, w))
    rows = []
    for n, line in enumerate(lp.read_text(encoding="utf-8-sig", errors="replace").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        row, why = _parse_line(parts, nc)
        if why is not None:
            out.bad_lines.append((f"{lp}:{n}", why))
            continue
        out.polygons += len(parts) > 5
        rows.append(row)
    if out.bad_lines and not rows:  # objects are there but none is readable: not a background image
        where, why = out.bad_lines[0]
        more = f" (and {len(out.bad_lines) - 1} more bad lines)" if len(out.bad_lines) > 1 else ""
        return _Checked(error=f"{where}: {why}{more}; no usable line left")
    arr = np.array(rows, np.float32).reshape(-1, 5)
    arr[:, 1:] = arr[:, 1:].clip(0.0, 1.0)
    out.labels = np.unique(arr, axis=0) if len(arr) else arr  # duplicate lines would double-count a box
    out.background = len(arr) == 0
    return out


def _parse_line(parts: list[str], nc: int) -> tuple[list[float], str | None]:
    """One label line -> [class, cx, cy, w, h] or the reason it is not usable. `class x1 y1 x2 y2 ...` (a
    segment polygon of 3+ points, as Ultralytics' segment datasets) becomes the polygon's bounding box."""
    k = len(parts)
    if k != 5 and (k < 7 or k % 2 == 0):
        return [], f"expected 5 values 'class cx cy w h' (or a polygon 'class x1 y1 x2 y2 x3 y3 ...'), got {k}"
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        return [], f"not a number in {' '.join(parts)!r}"
    if not all(np.isfinite(vals)):
        return [], f"not a finite number in {' '.join(parts)!r}"
    c = vals[0]
    if c != int(c) or not 0 <= c < nc:
        return [], f"class {parts[0]} is out of range 0..{nc - 1} (the yaml has {nc} names)"
    if k > 5:
        xy = np.array(vals[1:]).reshape(-1, 2)
        if xy.min() < -0.01 or xy.max() > 1.01:
            return [], "polygon point outside 0..1: coordinates must be normalised to the image size"
        (x1, y1), (x2, y2) = xy.min(0).clip(0, 1), xy.max(0).clip(0, 1)
        if x2 <= x1 or y2 <= y1:
            return [], "polygon has no area"
        return [c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], None
    cx, cy, bw, bh = vals[1:]
    if bw <= 0 or bh <= 0 or min(cx, cy) < -0.01 or max(cx, cy) > 1.01 or max(bw, bh) > 1.01:
        return [], f"box {cx} {cy} {bw} {bh} is not a normalised cx cy w h inside the image"
    return vals, None


def _stamp(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return None


def _fingerprint(images: list[Path], nc: int) -> tuple[str, list[tuple[int, int] | None]]:
    """-> the hash of every image's and label's path, size and mtime, and the images' (size, mtime_ns)."""
    h = hashlib.sha256(f"v{CACHE_VERSION}:{nc}".encode())
    stamps = []
    for p in images:
        h.update(str(p).encode())
        stamps.append(_stamp(p))
        for st in (stamps[-1], _stamp(label_path(p))):
            h.update(b"-" if st is None else f"{st[0]}:{st[1]}".encode())
    return h.hexdigest(), stamps


def cache_path_for(images: list[Path]) -> Path:
    """labels/<split>.labels.npz beside the labels, or in the user cache if that folder is read-only."""
    lp = label_path(images[0]).parent
    key = hashlib.sha256("\n".join(map(str, images[:1] + images[-1:])).encode()).hexdigest()[:16]
    if os.access(lp.parent, os.W_OK):
        return lp.parent / f"{lp.name}.labels.npz"
    from libreyolo.data.shapes import cache_root

    return cache_root() / "labels" / f"{key}.labels.npz"


def scan_labels(images: list[Path], nc: int, use_cache: bool = True, threads: int = 8) -> LabelSet:
    """Check every image and label file (in parallel), or load the cache if nothing changed."""
    if not images:
        return LabelSet([], [], [])
    fp, stamps = _fingerprint(images, nc)
    cpath = cache_path_for(images)
    if use_cache:
        cached = _load_cache(cpath, fp)
        if cached is not None:
            by_file = dict(zip(map(str, images), stamps))
            cached.stamps = [by_file[str(f)] for f in cached.files]
            return cached
    with ThreadPoolExecutor(max(1, threads)) as pool:
        results = list(pool.map(lambda p: _check_one(p, nc), images))
    out = LabelSet([], [], [])
    for img, stamp, r in zip(images, stamps, results):
        if r.error is not None:
            out.skipped.append((str(img), r.error))
            continue
        out.files.append(img)
        out.stamps.append(stamp)
        out.labels.append(r.labels)
        out.shapes.append(r.shape)
        out.backgrounds += r.background
        out.bad_lines += r.bad_lines
        out.polygons += r.polygons
    if use_cache:
        _save_cache(cpath, fp, out)
    return out


MAX_LINE_NOTES = 20  # dropped label lines reported one by one; the rest as a count


def scan_notes(ls: LabelSet, split: str, skipped: bool = True) -> list[str]:
    """Warning lines about a scanned split: each skipped image (unless skipped=False), the dropped label lines,
    the polygons used as boxes."""
    notes = [f"{split}: skipped {f}: {why}" for f, why in ls.skipped] if skipped else []
    notes += [f"{split}: dropped label line {where}: {why}" for where, why in ls.bad_lines[:MAX_LINE_NOTES]]
    if len(ls.bad_lines) > MAX_LINE_NOTES:
        notes.append(f"{split}: {len(ls.bad_lines)} label lines dropped in all ({MAX_LINE_NOTES} named above)")
    if ls.polygons:
        notes.append(
            f"{split}: {ls.polygons} label lines are segment polygons (class x1 y1 x2 y2 ...): each is used as its "
            "bounding box"
        )
    return notes


def no_boxes_message(ls: LabelSet, split: str, yaml_path: Path | str) -> str | None:
    """None if the split has at least one box; else what was found and where the labels were looked for."""
    if not len(ls) or ls.boxes:
        return None
    folders = sorted({str(label_path(f).parent) for f in ls.files})
    where = ", ".join(folders[:3]) + (f" and {len(folders) - 3} more folders" if len(folders) > 3 else "")
    missing = sum(not label_path(f).is_file() for f in ls.files)
    return (
        f"{yaml_path}: {split}: none of the {len(ls)} images has a box: {missing} have no label file and "
        f"{len(ls) - missing} an empty one. Labels are looked for in {where} (YOLO layout: .../images/x.jpg -> "
        ".../labels/x.txt, else x.txt beside the image); a folder named otherwise (e.g. annotations/) is not read."
    )


def _save_cache(path: Path, fp: str, ls: LabelSet) -> None:
    counts = np.array([len(x) for x in ls.labels], np.int64)
    try:
        with written_whole(path) as tmp:  # its name keeps .npz, which np.savez would otherwise append
            np.savez(
                tmp,
                fingerprint=np.array(fp),
                files=np.array([str(p) for p in ls.files]),
                counts=counts,
                labels=np.concatenate(ls.labels) if ls.labels else np.zeros((0, 5), np.float32),
                shapes=np.array(ls.shapes, np.int64).reshape(-1, 2),
                skipped=np.array([f"{f}\t{r}" for f, r in ls.skipped] or [""]),
                backgrounds=np.array(ls.backgrounds),
                bad_lines=np.array([f"{f}\t{r}" for f, r in ls.bad_lines] or [""]),
                polygons=np.array(ls.polygons),
            )
    except OSError:
        pass  # a cache is an optimisation; a read-only or full disk must not stop training


def _load_cache(path: Path, fp: str) -> LabelSet | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["fingerprint"]) != fp:
                return None
            counts = z["counts"]
            labels = np.split(z["labels"], np.cumsum(counts)[:-1]) if len(counts) else []
            skipped = [tuple(s.split("\t", 1)) for s in z["skipped"].tolist() if s]
            bad_lines = [tuple(s.split("\t", 1)) for s in z["bad_lines"].tolist() if s]
            return LabelSet(
                files=[Path(f) for f in z["files"].tolist()],
                labels=[np.asarray(x, np.float32) for x in labels],
                shapes=[tuple(int(v) for v in s) for s in z["shapes"]],
                skipped=skipped,
                backgrounds=int(z["backgrounds"]),
                bad_lines=bad_lines,
                polygons=int(z["polygons"]),
            )
    except (OSError, KeyError, ValueError):
        return None
