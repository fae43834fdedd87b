"""Files that appear whole or not at all: each is written under a hidden temporary name beside its place and renamed
into place once complete (one rename on one file system), so a reader (the console, another rank, a later run)
never sees half a file, and a failure leaves the old file and no temporary one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """Yields the temporary path to write (hidden, this process's id in it, `path`'s suffix kept for writers that
    choose the format by it); on a clean exit it replaces `path`; any failure removes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    with written_whole(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: Path, data: bytes) -> None:
    with written_whole(path) as tmp:
        tmp.write_bytes(data)
