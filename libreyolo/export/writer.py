"""Exported files appear whole or not at all: each is written under a hidden temporary name in its folder and
renamed into place once written, read back and checked; any failure removes the temporary file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """Yields the temporary path to write; on a clean exit it replaces `path` (one rename on one file system)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
