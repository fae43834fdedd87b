"""cfg.cache -> an image source for YOLODataset: `ram` (one shared buffer, data/ramcache.py, built before training),
`auto` (the same buffer, filled as the loader first decodes each image), `disk` (.npy files, data/diskcache.py) or
none.

Both hold exactly what `decode.load_resized` returns, so batches are byte-identical with or without a
cache. The bytes needed are known before anything is decoded (long side imgsz, uint8); a RAM cache that
would not fit with room to spare falls back to disk, and a disk cache that would not fit to no cache,
each with a warning that names the numbers: a cache must never push the machine into swap."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

import numpy as np
import psutil

from libreyolo.data.decode import slot_bytes
from libreyolo.data.diskcache import open_disk_cache
from libreyolo.data.labels import LabelSet
from libreyolo.data.ramcache import open_ram_cache

GiB = 1 << 30


class ImageSource(Protocol):
    mode: str
    bad: list[tuple[str, str]]

    def get(self, i: int) -> np.ndarray | None: ...

    def put(self, i: int, img: np.ndarray) -> None:
        """Image i as load_resized returned it, decoded because get(i) had none: kept by a cache being filled."""

    def filled(self) -> int | None:
        """How many images a cache being filled (cache=auto) holds so far; None for one built before training."""

    def close(self) -> None: ...


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def estimate_bytes(shapes: list[tuple[int, int]], imgsz: int) -> int:
    """Bytes of the decoded images (long side imgsz, uint8 RGB) for images of these (h, w)."""
    return sum(slot_bytes(s, imgsz) for s in shapes)


def ram_reserve(total: int) -> int:
    """Memory left free beside a RAM cache for the model, the loader workers and their batches."""
    return max(4 * GiB, total // 4)


def ram_refusal(need: int, folder: Path, available: int | None = None, total: int | None = None) -> str | None:
    """Why a RAM cache of `need` bytes in `folder` must not be built, or None if it fits with the reserve."""
    vm = psutil.virtual_memory()
    available = vm.available if available is None else available
    total = vm.total if total is None else total
    reserve = ram_reserve(total)
    if need + reserve > available:
        return (
            f"it needs {fmt_bytes(need)} but {fmt_bytes(available)} of memory is available (psutil) and "
            f"{fmt_bytes(reserve)} must stay free for training"
        )
    free = _free_bytes(folder)
    if need + GiB > free:  # the loader's batches also travel through /dev/shm
        return (
            f"it needs {fmt_bytes(need)} but {folder} has {fmt_bytes(free)} free (in a container, a larger "
            f"--shm-size; Docker's default is 64 MB)"
        )
    return None


def auto_refusal(need: int, folder: Path, available: int | None = None, total: int | None = None) -> str | None:
    """ram_refusal, and for cache=auto (the default) also at most a quarter of the machine's memory: a run
    that did not ask for a cache does not take more than that of it."""
    total = psutil.virtual_memory().total if total is None else total
    if need > total // 4:
        return (
            f"it needs {fmt_bytes(need)}, more than a quarter of this machine's {fmt_bytes(total)} of memory, "
            "which cache=auto takes at most"
        )
    return ram_refusal(need, folder, available, total)


def disk_refusal(need: int, folder: Path) -> str | None:
    root = _existing(folder)
    du = shutil.disk_usage(root)
    reserve = max(GiB, du.total // 20)
    if need + reserve > du.free:
        return (
            f"it needs {fmt_bytes(need)} more but {root} has {fmt_bytes(du.free)} free "
            f"({fmt_bytes(reserve)} must stay free)"
        )
    return None


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _free_bytes(folder: Path) -> int:
    return shutil.disk_usage(_existing(folder)).free


def open_image_cache(
    mode: bool | str,
    labels: LabelSet,
    imgsz: int,
    split: str,
    notes: list[str],
    available: int | None = None,
    threads: int | None = None,
    progress: bool = True,
    note_bad: bool = True,
) -> ImageSource | None:
    """The image source for cache=mode (True means ram), falling back ram -> disk -> none when it won't fit;
    `auto` is ram, filled as the images are first decoded (no wait before training), when it fits in a quarter of
    the memory (auto_refusal), and otherwise none (it never writes beside the user's images unasked).
    Warnings (fallbacks and, with note_bad, files that could not be decoded) are appended to notes; the
    source's `bad` lists those files too. Close the source at the end."""
    if not mode or not len(labels):
        return None
    mode = "ram" if mode is True else str(mode)
    if mode not in ("ram", "disk", "auto"):
        raise ValueError(f"cache={mode!r}: expected ram, disk, auto or false")
    files = [str(f) for f in labels.files]
    desc = f"caching {split} images ({len(files)}, imgsz {imgsz})"
    source: ImageSource | None = None
    if mode in ("ram", "auto"):
        auto = mode == "auto"
        got = open_ram_cache(
            files,
            labels.shapes,
            labels.stamps,
            imgsz,
            desc,
            lambda n, f: (auto_refusal if auto else ram_refusal)(n, f, available),
            notes,
            threads,
            progress,
            lazy=auto,
        )
        if isinstance(got, str) and auto:
            notes.append(
                f"cache=auto for the {split} images (imgsz {imgsz}): {got}; training without an image cache "
                "(cache=ram or cache=disk cache them anyway; cache=false trains without one and without this note)."
            )
            return None
        if isinstance(got, str):
            notes.append(
                f"cache=ram for the {split} images (imgsz {imgsz}): {got}; caching on disk instead. "
                f"Set cache=disk to skip this check, lower imgsz, or free memory."
            )
            mode = "disk"
        else:
            source = got
    if mode == "disk":
        got = open_disk_cache(files, labels.shapes, labels.stamps, imgsz, desc, disk_refusal, threads, progress)
        if isinstance(got, str):
            notes.append(f"cache=disk for the {split} images (imgsz {imgsz}): {got}; training without an image cache.")
            return None
        source = got
        if got.write_errors:
            f, err = got.write_errors[0]
            notes.append(
                f"cache=disk: {len(got.write_errors)} {split} entries could not be written (first: {f}: {err}); those "
                "images are decoded each time"
            )
    for f, why in source.bad if note_bad else []:
        notes.append(
            f"{split}: {f} could not be decoded while caching ({why}); it is skipped (replaced by its neighbour) when "
            "met"
        )
    return source
