"""Scan and check YOLO labels once; keep the result in a label cache so later runs start at once.

Each bad file is skipped, counted and reported by name (with the line and the reason); it is never fatal
unless nothing usable is left."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from libreyolo.data.config import label_path

CACHE_VERSION = 1


@dataclass
class LabelSet:
    files: list[Path]
    labels: list[np.ndarray]  # per image (n, 5) float32: class, cx, cy, w, h (normalised)
    shapes: list[tuple[int, int]]  # per image (height, width)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    backgrounds: int = 0  # images without a label file or with an empty one
    # per image (size, mtime_ns) as stat'ed for this scan, or None if it could not be; the image caches key
    # and check their entries with these instead of stat'ing every image again
    stamps: list[tuple[int, int] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.files)


def _check_one(image: Path, nc: int) -> tuple[np.ndarray | None, tuple[int, int] | None, str | None, bool]:
    """-> labels, (h, w), error reason, is_background."""
    try:
        with Image.open(image) as im:
            w, h = im.size
            im.verify()
    except Exception as e:  # PIL raises many types for broken files
        return None, None, f"unreadable image ({type(e).__name__}: {e})", False
    if w < 2 or h < 2:
        return None, None, f"image is {w}x{h} pixels", False
    lp = label_path(image)
    if not lp.is_file():
        return np.zeros((0, 5), np.float32), (h, w), None, True
    rows = []
    for n, line in enumerate(lp.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        where = f"{lp}:{n}"
        if len(parts) != 5:
            return None, None, f"{where}: expected 5 values 'class cx cy w h', got {len(parts)}", False
        try:
            vals = [float(p) for p in parts]
        except ValueError:
            return None, None, f"{where}: not a number in {line.strip()!r}", False
        c = vals[0]
        if c != int(c) or not 0 <= c < nc:
            return None, None, f"{where}: class {parts[0]} is out of range 0..{nc - 1} (the yaml has {nc} names)", False
        cx, cy, bw, bh = vals[1:]
        if (
            not all(np.isfinite(vals))
            or bw <= 0
            or bh <= 0
            or min(cx, cy) < -0.01
            or max(cx, cy) > 1.01
            or max(bw, bh) > 1.01
        ):
            return None, None, f"{where}: box {cx} {cy} {bw} {bh} is not a normalised cx cy w h inside the image", False
        rows.append(vals)
    arr = np.array(rows, np.float32).reshape(-1, 5)
    arr[:, 1:] = arr[:, 1:].clip(0.0, 1.0)
    arr = np.unique(arr, axis=0) if len(arr) else arr  # duplicate lines would double-count a box
    return arr, (h, w), None, len(arr) == 0


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
    for img, stamp, (lab, shape, err, bg) in zip(images, stamps, results):
        if err is not None:
            out.skipped.append((str(img), err))
            continue
        out.files.append(img)
        out.stamps.append(stamp)
        out.labels.append(lab)
        out.shapes.append(shape)
        out.backgrounds += bg
    if use_cache:
        _save_cache(cpath, fp, out)
    return out


def _save_cache(path: Path, fp: str, ls: LabelSet) -> None:
    counts = np.array([len(x) for x in ls.labels], np.int64)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
        np.savez(
            tmp,
            fingerprint=np.array(fp),
            files=np.array([str(p) for p in ls.files]),
            counts=counts,
            labels=np.concatenate(ls.labels) if ls.labels else np.zeros((0, 5), np.float32),
            shapes=np.array(ls.shapes, np.int64).reshape(-1, 2),
            skipped=np.array([f"{f}\t{r}" for f, r in ls.skipped] or [""]),
            backgrounds=np.array(ls.backgrounds),
        )
        os.replace(tmp, path)
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
            return LabelSet(
                files=[Path(f) for f in z["files"].tolist()],
                labels=[np.asarray(x, np.float32) for x in labels],
                shapes=[tuple(int(v) for v in s) for s in z["shapes"]],
                skipped=skipped,
                backgrounds=int(z["backgrounds"]),
            )
    except (OSError, KeyError, ValueError):
        return None
