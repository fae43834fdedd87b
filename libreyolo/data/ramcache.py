"""cache=ram: every image decoded once into ONE file in /dev/shm that every process maps read-only.

Loader workers (forked or spawned) and the DDP ranks of one host all map the same pages, so the images
are held once per host, not once per worker or per rank. The file is named by a hash of the file list,
their sizes and modification times and imgsz; the first process builds it (under a host lock) while the
others wait, then map it.

Lifetime: every process using the file holds a shared lock on its `.lock` file; the last one to close
deletes it (normally at the end of the run). A run that crashes leaves the file behind: the next run with
the same images reuses it, and any run that builds a RAM cache deletes the ones no live process holds.

Layout: [image slots][index: n rows of (offset, height, width, ok) int64][footer: magic, n, index offset]"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import sys
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from libreyolo.data.decode import decode_all, slot_bytes
from libreyolo.data.hostlock import HostLock, shared_dir
from libreyolo.errors import DataError

MAGIC = b"LYRAM001"
_FOOTER = struct.Struct("<8sqq")
PREFIX = "libreyolo-ram-"


def cache_key(files: list[str], stamps: list[tuple[int, int] | None], imgsz: int) -> str:
    """From each file's path, size and mtime (`LabelSet.stamps`) and imgsz."""
    h = hashlib.sha256(f"{MAGIC!r} imgsz={imgsz}".encode())
    for f, st in zip(files, stamps, strict=True):
        h.update(f"{f}\0-\n".encode() if st is None else f"{f}\0{st[0]}\0{st[1]}\n".encode())
    return h.hexdigest()[:20]


class RamCache:
    """`get(i)` -> a read-only (h, w, 3) uint8 view of image i, or None if it was not cached."""

    mode = "ram"

    def __init__(self, path: Path, n: int, users: HostLock):
        self.path, self.n, self._users = path, n, users
        self.bad: list[tuple[str, str]] = []
        self.built = False  # False when another process (or an earlier run) had built it
        self._data: np.ndarray | None = None
        self._index: np.ndarray | None = None
        self._finalizer = weakref.finalize(self, _release, path, users, os.getpid())

    def get(self, i: int) -> np.ndarray | None:
        if self._index is None:
            self._map()
        off, h, w, ok = (int(v) for v in self._index[i])
        if not ok:
            return None
        return self._data[off : off + h * w * 3].reshape(h, w, 3)

    def _map(self) -> None:
        with open(self.path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        magic, n, idx_off = _FOOTER.unpack_from(mm, len(mm) - _FOOTER.size) if len(mm) >= _FOOTER.size else (b"", 0, 0)
        if magic != MAGIC or n != self.n:
            raise DataError(f"{self.path} is not a complete RAM cache of {self.n} images; delete it and start again")
        self._index = np.frombuffer(mm, np.int64, count=4 * n, offset=idx_off).reshape(n, 4)
        self._data = np.frombuffer(mm, np.uint8, count=idx_off)

    def close(self) -> None:
        """Stop using the cache; the last process on the host to close it deletes the file."""
        self._data = self._index = None
        if self._finalizer is not None:  # None in a spawned worker, which holds no lock to release
            self._finalizer()

    def __getstate__(self) -> dict:
        # a spawned worker receives the path and maps the file itself: the pages are never pickled
        state = dict(self.__dict__)
        state.update(_data=None, _index=None, _finalizer=None)
        return state


def _release(path: Path, users: HostLock, owner: int) -> None:
    if os.getpid() != owner:  # a forked worker exiting must not release its parent's lock
        return
    users.release()
    last = HostLock(users.path)
    if last.acquire(wait=False):  # nobody else holds it shared: we were the last user
        path.unlink(missing_ok=True)
    last.release()


def open_ram_cache(
    files: list[str],
    shapes: list[tuple[int, int]],
    stamps: list[tuple[int, int] | None],
    imgsz: int,
    desc: str,
    refuse: Callable[[int, Path], str | None],
    notes: list[str],
    threads: int | None = None,
    progress: bool = True,
) -> RamCache | str:
    """Map the host's RAM cache of these files, building it first if no process has. `refuse(bytes, folder)`
    returns a reason not to build (memory), which is returned instead of a cache."""
    folder = shared_dir()
    key = cache_key(files, stamps, imgsz)
    path = folder / f"{PREFIX}{key}.bin"
    users = HostLock(folder / f"{PREFIX}{key}.lock")
    users.acquire(shared=True)  # before looking at the file, so no sweeper can delete it under us
    build = HostLock(folder / f"{PREFIX}{key}.build.lock")
    try:
        if not build.acquire(wait=False):
            if progress:  # said now (the wait can be minutes), by the process that talks to the terminal; not a warning
                print(
                    f"{desc}: waiting for another process (a DDP rank or a run on the same images) to finish {path}",
                    file=sys.stderr,
                    flush=True,
                )
            build.acquire()
        try:
            cache = RamCache(path, len(files), users)
            if path.exists():
                try:
                    cache._map()
                    missing = np.flatnonzero(cache._index[:, 3] == 0)
                    cache.bad = [(files[i], "could not be decoded when this RAM cache was built") for i in missing]
                    return cache
                except (DataError, ValueError, OSError):
                    path.unlink(missing_ok=True)  # a cache file from another version or a torn copy
            _sweep_orphans(folder, key, notes)
            slots = np.array([slot_bytes(s, imgsz) for s in shapes], np.int64)
            need = int(slots.sum())
            why = refuse(need, folder)
            if why is not None:
                cache._finalizer.detach()
                users.release()
                return why
            try:
                cache.bad = _build(path, files, shapes, slots, imgsz, desc, threads, progress)
            except OSError as e:  # ENOSPC from the reservation, a folder we may not write
                cache._finalizer.detach()
                users.release()
                return f"writing {need / 1e9:.2f} GB to {folder} failed ({e})"
            cache.built = True
            return cache
        finally:
            build.release()
    except BaseException:
        users.release()
        raise


def _build(
    path: Path,
    files: list[str],
    shapes: list[tuple[int, int]],
    slots: np.ndarray,
    imgsz: int,
    desc: str,
    threads: int | None,
    progress: bool,
) -> list[tuple[str, str]]:
    n = len(files)
    offsets = np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64)
    idx_off = -(-int(slots.sum()) // 8) * 8
    total = idx_off + n * 32 + _FOOTER.size
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "w+b") as f:
            if hasattr(os, "posix_fallocate"):
                # reserve every page now: a tmpfs that fills up fails here with ENOSPC, not with a SIGBUS
                # that kills the process halfway through writing the images
                os.posix_fallocate(f.fileno(), 0, total)
            else:
                f.truncate(total)
            mm = mmap.mmap(f.fileno(), total)
        data = np.frombuffer(mm, np.uint8, count=idx_off)
        index = np.frombuffer(mm, np.int64, count=4 * n, offset=idx_off).reshape(n, 4)
        index[:, 0] = offsets

        store = _writer(data, index, offsets, slots)

        long_sides = [max(s) for s in shapes]
        bad = decode_all(files, long_sides, imgsz, store, f"{desc} -> RAM", threads, progress)
        _FOOTER.pack_into(mm, total - _FOOTER.size, MAGIC, n, idx_off)
        mm.flush()
        del store, data, index  # views pin the mapping: close() fails while one exists
        mm.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return bad


def _sweep_orphans(folder: Path, keep: str, notes: list[str]) -> None:
    """Delete RAM caches that no live process holds (left by crashed runs): they only occupy memory."""
    for f in sorted(folder.glob(f"{PREFIX}*.bin*")):
        key = f.name[len(PREFIX) :].split(".", 1)[0]
        partial = not f.name.endswith(".bin")
        if key == keep:
            if partial:  # we hold this key's build lock, so no one is still writing it
                f.unlink(missing_ok=True)
            continue
        # a finished file is orphaned when nobody uses it; a partial one when nobody is building it
        lock = HostLock(folder / f"{PREFIX}{key}{'.build.lock' if partial else '.lock'}")
        try:
            if lock.acquire(wait=False):
                size = f.stat().st_size
                f.unlink()
                notes.append(
                    f"removed {f} ({size / 1e9:.2f} GB), a RAM cache no running process uses (left by a run that did "
                    "not finish)"
                )
        except OSError:
            pass  # another user's file, or already gone
        finally:
            lock.release()


def _writer(
    data: np.ndarray, index: np.ndarray, offsets: np.ndarray, slots: np.ndarray
) -> Callable[[int, np.ndarray], None]:
    """store(i, img) into the mapped cache: the image's bytes at its offset, its shape in the index."""

    def store(i: int, img: np.ndarray) -> None:
        if img.nbytes > slots[i]:
            return  # unexpected shape: left uncached, so this sample is decoded per access (same bytes)
        o = offsets[i]
        data[o : o + img.nbytes] = img.reshape(-1)
        index[i, 1:] = (img.shape[0], img.shape[1], 1)

    return store
