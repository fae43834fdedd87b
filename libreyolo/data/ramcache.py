"""cache=ram and cache=auto: every image decoded once into ONE file in /dev/shm that every process maps.

Loader workers (forked or spawned) and the DDP ranks of one host all map the same pages, so the images
are held once per host, not once per worker or per rank. The file is named by a hash of the file list,
their sizes and modification times and imgsz; the first process builds it (under a host lock) while the
others wait, then map it.

Two ways to fill it:
- built (cache=ram): every image decoded before training starts, by one thread per CPU; the file is then read-only;
- filled (cache=auto, lazy=True): the file is made empty, at once, and each image is stored by whichever process
  (a loader worker) first decodes it for a batch (`put`): the decoding the first epoch does anyway, with no wait at
  the start; later epochs read it. The worker writes the image into the file (pwrite), not into the mapping, so a
  /dev/shm that fills up meanwhile means fewer images cached (ENOSPC), never a crash (SIGBUS) in a worker; the
  pages are taken by the (niced) workers as they go, not by a thread of the training process competing with its
  start. Two workers storing the same image write the same bytes; its index row says cached only after its bytes
  are written.

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
from typing import BinaryIO

import numpy as np

from libreyolo.data.decode import decode_all, slot_bytes
from libreyolo.data.hostlock import HostLock, shared_dir
from libreyolo.errors import DataError

MAGIC = b"LYRAM003"  # built: every image decoded before the file was put in place
FILLING = b"LYRAMF03"  # made empty, filled as images are decoded
_FOOTER = struct.Struct("<8sqq")
PREFIX = "libreyolo-ram-"


def cache_key(files: list[str], stamps: list[tuple[int, int] | None], imgsz: int) -> str:
    """From each file's path, size and mtime (`LabelSet.stamps`) and imgsz."""
    h = hashlib.sha256(f"{MAGIC!r} imgsz={imgsz}".encode())
    for f, st in zip(files, stamps, strict=True):
        h.update(f"{f}\0-\n".encode() if st is None else f"{f}\0{st[0]}\0{st[1]}\n".encode())
    return h.hexdigest()[:20]


class RamCache:
    """`get(i)` -> a read-only (h, w, 3) uint8 view of image i, or None if it is not cached (yet). A cache opened to
    be filled (fill=True) stores what put(i, image) is given for an image it does not hold."""

    mode = "ram"

    def __init__(self, path: Path, n: int, users: HostLock, fill: bool = False):
        self.path, self.n, self._users, self.fill = path, n, users, fill
        self.bad: list[tuple[str, str]] = []
        self.built = False  # False when another process (or an earlier run) had built it
        self._data: np.ndarray | None = None
        self._index: np.ndarray | None = None
        self._file: BinaryIO | None = None  # open while filling: put() writes the images through it
        self.filling = False  # the file was made to be filled (not built), as read from it
        self._finalizer = weakref.finalize(self, _release, path, users, os.getpid())

    def get(self, i: int) -> np.ndarray | None:
        if self._index is None:
            self._map()
        assert self._index is not None and self._data is not None
        off, h, w, ok = (int(v) for v in self._index[i])
        if not ok:
            return None
        img = self._data[off : off + h * w * 3].reshape(h, w, 3)
        img.flags.writeable = False  # a mapping opened to be filled is writable: augmentations must copy
        return img

    def put(self, i: int, img: np.ndarray) -> None:
        """Store image i (what load_resized returned) if this cache is being filled, does not hold it yet, the
        image fits its slot and /dev/shm has room for it; otherwise nothing (decoded again at the next access)."""
        if not self.fill:
            return
        if self._index is None:
            self._map()
        assert self._index is not None and self._data is not None and self._file is not None
        row = self._index[i]
        if row[3]:
            return
        off = int(row[0])
        end = int(self._index[i + 1, 0]) if i + 1 < self.n else len(self._data)
        if off + img.nbytes > end:
            return  # an unexpected shape
        flat = np.ascontiguousarray(img).reshape(-1)
        if hasattr(os, "pwrite"):
            # a write() to a full tmpfs fails with ENOSPC where a store into the mapping would be a SIGBUS, and it
            # takes the pages in one call, where a store into the mapping faults them in one by one
            try:
                if os.pwrite(self._file.fileno(), flat, off) != flat.nbytes:
                    return  # a short write: /dev/shm filled up
            except OSError:
                return
        else:  # Windows: the file is in the temp folder, on disk, and takes its pages as they are written
            self._data[off : off + flat.nbytes] = flat
        row[1], row[2] = img.shape[0], img.shape[1]
        row[3] = 1  # last: a reader that sees it sees the bytes

    def filled(self) -> int | None:
        """Images stored so far in a cache made to be filled (cache=auto), by every process; None for a built one."""
        if self._index is None:
            self._map()
        assert self._index is not None
        return int(np.count_nonzero(self._index[:, 3])) if self.filling else None

    def _map(self) -> None:
        f = open(self.path, "r+b" if self.fill else "rb")  # noqa: SIM115 (kept open while filling)
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE if self.fill else mmap.ACCESS_READ)
            magic, n, idx_off = (
                _FOOTER.unpack_from(mm, len(mm) - _FOOTER.size) if len(mm) >= _FOOTER.size else (b"", 0, 0)
            )
            if magic not in (MAGIC, FILLING) or n != self.n:
                raise DataError(
                    f"{self.path} is not a complete RAM cache of {self.n} images; delete it and start again"
                )
        except BaseException:
            f.close()
            raise
        if self.fill:
            self._file = f
        else:
            f.close()
        self.filling = magic == FILLING
        self._index = np.frombuffer(mm, np.int64, count=4 * n, offset=idx_off).reshape(n, 4)
        self._data = np.frombuffer(mm, np.uint8, count=idx_off)

    def close(self) -> None:
        """Stop using the cache; the last process on the host to close it deletes the file."""
        self._data = self._index = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._finalizer is not None:  # None in a spawned worker, which holds no lock to release
            self._finalizer()

    def __getstate__(self) -> dict:
        # a spawned worker receives the path and maps the file itself: the pages are never pickled
        state = dict(self.__dict__)
        state.update(_data=None, _index=None, _file=None, _finalizer=None)
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
    lazy: bool = False,
) -> RamCache | str:
    """Map the host's RAM cache of these files, building it first if no process has. `refuse(bytes, folder)`
    returns a reason not to build (memory), which is returned instead of a cache. lazy: make it empty and fill it
    as the images are first decoded (RamCache.put) instead of building it first."""
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
            cache = RamCache(path, len(files), users, fill=lazy)
            if path.exists():
                try:
                    cache._map()
                    if cache.filling and not cache.fill:  # cache=ram after cache=auto: fill the rest as it goes
                        cache.fill = True
                        cache._map()
                    assert cache._index is not None
                    if not cache.filling:
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
                if lazy:
                    _create(path, slots)
                else:
                    cache.bad = _build(path, files, shapes, slots, imgsz, desc, threads, progress)
            except OSError as e:  # ENOSPC from the build's reservation, a folder we may not write
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


def _data_bytes(slots: np.ndarray) -> int:
    """The image slots' bytes, rounded up to 8 for the index that follows them."""
    return -(-int(slots.sum()) // 8) * 8


def _layout(path: Path, slots: np.ndarray, reserve: bool) -> tuple[Path, mmap.mmap, np.ndarray, np.ndarray]:
    """A new cache file's partial copy beside path, mapped, with every slot's offset in its index and nothing
    cached: (its path, the mapping, the image bytes, the index). reserve: posix_fallocate it whole first."""
    n = len(slots)
    idx_off = _data_bytes(slots)
    total = idx_off + n * 32 + _FOOTER.size
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "w+b") as f:
            if reserve and hasattr(os, "posix_fallocate"):
                # every page now: a tmpfs that fills up fails here with ENOSPC, not with a SIGBUS that kills the
                # process halfway through writing the images
                os.posix_fallocate(f.fileno(), 0, total)
            else:
                f.truncate(total)
            mm = mmap.mmap(f.fileno(), total)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    data = np.frombuffer(mm, np.uint8, count=idx_off)
    index = np.frombuffer(mm, np.int64, count=4 * n, offset=idx_off).reshape(n, 4)
    index[:, 0] = np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64)
    return tmp, mm, data, index


def _finish(tmp: Path, path: Path, mm: mmap.mmap, n: int, idx_off: int, magic: bytes) -> None:
    _FOOTER.pack_into(mm, len(mm) - _FOOTER.size, magic, n, idx_off)
    mm.flush()
    mm.close()
    os.replace(tmp, path)


def _create(path: Path, slots: np.ndarray) -> None:
    """An empty cache file, to be filled by put()."""
    tmp, mm, data, index = _layout(path, slots, reserve=False)
    try:
        del data, index  # views pin the mapping: close() fails while one exists
        _finish(tmp, path, mm, len(slots), _data_bytes(slots), FILLING)
    finally:
        tmp.unlink(missing_ok=True)


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
    tmp, mm, data, index = _layout(path, slots, reserve=True)
    try:
        store = _writer(data, index, index[:, 0].copy(), slots)
        long_sides = [max(s) for s in shapes]
        bad = decode_all(files, long_sides, imgsz, store, f"{desc} -> RAM", threads, progress)
        del store, data, index  # views pin the mapping: close() fails while one exists
        _finish(tmp, path, mm, len(files), _data_bytes(slots), MAGIC)
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
