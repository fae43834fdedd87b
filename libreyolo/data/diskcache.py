"""cache=disk: each image decoded once to `<image file name>.<imgsz>.npy` beside it (or, when its folder is
not writable, under the user cache folder), and reused by later runs.

An entry is stale when imgsz differs (it is part of the name) or its source changed: an entry is written
with its source's modification time, so an edit, a `touch` or a replaced file makes the two differ and the
entry is rebuilt. Reading a .npy (a header and a memcpy) costs a fraction of decoding a JPEG."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from libreyolo.data.decode import decode_all, slot_bytes
from libreyolo.data.hostlock import HostLock, shared_dir
from libreyolo.data.shapes import cache_root

_writable_folders: dict[Path, bool] = {}


def _writable(folder: Path) -> bool:
    """Can we create files in folder? Tried for real: permissions, ACLs and read-only mounts all count."""
    if folder not in _writable_folders:
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".libreyolo-probe-")
            os.close(fd)
            os.unlink(probe)
            _writable_folders[folder] = True
        except OSError:
            _writable_folders[folder] = False
    return _writable_folders[folder]


def entry_path(src: Path, imgsz: int) -> Path:
    folder = src.parent
    if not _writable(folder):
        folder = cache_root() / "npy" / hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return folder / f"{src.name}.{imgsz}.npy"


def _mtime_ns(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class DiskCache:
    """`get(i)` -> image i from its .npy, or None (missing or unusable entry: the caller decodes the file)."""

    mode = "disk"

    def __init__(self, entries: list[Path], imgsz: int):
        self.entries = [str(e) for e in entries]
        self.imgsz = imgsz
        self.bad: list[tuple[str, str]] = []
        self.written = 0
        self.reused = 0
        self.write_errors: list[tuple[str, str]] = []

    def get(self, i: int) -> np.ndarray | None:
        try:
            img = np.load(self.entries[i], allow_pickle=False)
        except (OSError, ValueError):
            return None
        if img.ndim != 3 or img.dtype != np.uint8 or max(img.shape[:2]) != self.imgsz:
            return None
        return img

    def put(self, i: int, img: np.ndarray) -> None:
        """Entries are written when the cache is built (data/cache.py), not during training."""

    def filled(self) -> int | None:
        return None  # built before training

    def close(self) -> None:
        """Entries stay on disk for later runs; delete the `*.npy` files to reclaim the space."""


def open_disk_cache(
    files: list[str],
    shapes: list[tuple[int, int]],
    stamps: list[tuple[int, int] | None],
    imgsz: int,
    desc: str,
    refuse: Callable[[int, Path], str | None],
    threads: int | None = None,
    progress: bool = True,
) -> DiskCache | str:
    """Reuse fresh entries, (re)build missing and stale ones. `refuse(bytes, folder)` returns a reason not to
    write them (disk space), which is returned instead of a cache."""
    key = hashlib.sha256("\n".join([str(imgsz), *files]).encode()).hexdigest()[:20]
    lock = HostLock(shared_dir() / f"libreyolo-disk-{key}.lock")
    lock.acquire()  # DDP ranks of one host: the first builds, the others then find every entry fresh
    try:
        return _open(
            files, shapes, [None if st is None else st[1] for st in stamps], imgsz, desc, refuse, threads, progress
        )
    finally:
        lock.release()


def _open(
    files: list[str],
    shapes: list[tuple[int, int]],
    src_mtime: list[int | None],
    imgsz: int,
    desc: str,
    refuse: Callable[[int, Path], str | None],
    threads: int | None,
    progress: bool,
) -> DiskCache | str:
    entries = [entry_path(Path(f), imgsz) for f in files]
    cache = DiskCache(entries, imgsz)
    stale, seen = [], set()  # an image listed twice (oversampling) is one entry, decoded once
    for i, (e, m) in enumerate(zip(entries, src_mtime)):
        if e not in seen and (m is None or _mtime_ns(e) != m):
            stale.append(i)
        seen.add(e)
    cache.reused = len(seen) - len(stale)
    if not stale:
        return cache
    need = sum(slot_bytes(shapes[i], imgsz) + 128 for i in stale)
    folder = entries[stale[0]].parent
    why = refuse(need, folder)
    if why is not None:
        return why
    for i in stale:
        # an old entry must never outlive its source, even if the source no longer decodes
        entries[i].unlink(missing_ok=True)
    for f in {entries[i].parent for i in stale}:
        f.mkdir(parents=True, exist_ok=True)

    def store(k: int, img: np.ndarray) -> None:
        i = stale[k]
        try:
            _write(entries[i], img, src_mtime[i])
            cache.written += 1
        except OSError as e:  # a full or failing disk costs speed, not the run: the sample is decoded instead
            cache.write_errors.append((str(entries[i]), str(e)))

    cache.bad = decode_all(
        [files[i] for i in stale], [max(shapes[i]) for i in stale], imgsz, store, f"{desc} -> disk", threads, progress
    )
    return cache


def _write(entry: Path, img: np.ndarray, mtime_ns: int | None) -> None:
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, img, allow_pickle=False)
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, entry)  # atomic: a reader (another rank, a later run) sees all of it or nothing
    finally:
        tmp.unlink(missing_ok=True)
