"""Follow a growing file (events.jsonl, stdout.log) from an offset, the way `tail -F` does.

Only complete lines are returned: a partial last line (the writer is mid-line) stays buffered until its
newline arrives. A file that shrinks (truncated), is replaced by another (rotated: a new inode), or whose
first bytes changed (truncated and rewritten past our offset between two polls) is read again from the
start, and the reader is told so, so that whatever it built from the old content can be rebuilt."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from libreyolo.api import READABLE_VERSIONS

CHUNK = 4 << 20  # bytes per read: a long run's file is delivered in pieces, so the UI stays responsive
_HEAD = 256  # bytes remembered from the start of the file to notice a rewrite


class LineTail:
    """Returns the complete lines appended to `path` since the last call."""

    def __init__(self, path: str | os.PathLike[str], offset: int = 0, from_end: int | None = None):
        """`from_end=N` starts N bytes before the current end (dropping the partial first line): the
        last screens of a long log, without reading all of it."""
        self.path = Path(path)
        self.offset = offset
        self._buf = b""
        self._ino: int | None = None
        self._head = b""
        self._skip_partial = False
        if from_end is not None:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            self.offset = max(0, size - from_end)
            self._skip_partial = self.offset > 0

    def read(self) -> LineBatch:
        """The new complete lines; `reset` when the file was truncated or replaced since the last call
        (the lines then come from its start); `more` when data remains beyond this chunk."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return LineBatch()
        with f:
            st = os.fstat(f.fileno())
            head = f.read(_HEAD)
            reset = self._ino is not None and (
                st.st_ino != self._ino
                or st.st_size < self.offset
                or not head.startswith(self._head[: len(head)])
                or len(head) < len(self._head)
            )
            if reset:
                self.offset, self._buf, self._skip_partial = 0, b"", False
            self._ino, self._head = st.st_ino, head
            if st.st_size <= self.offset:
                return LineBatch(reset=reset)
            f.seek(self.offset)
            data = f.read(CHUNK)
        self.offset += len(data)
        parts = (self._buf + data).split(b"\n")
        self._buf = parts.pop()  # the partial last line, or b"" after a trailing newline
        if self._skip_partial and parts:
            parts.pop(0)
            self._skip_partial = False
        return LineBatch([p.decode("utf-8", "replace") for p in parts], reset, self.offset < st.st_size)


@dataclass
class LineBatch:
    lines: list[str] = field(default_factory=list)
    reset: bool = False  # the file started over: drop what was built from it before
    more: bool = False  # more data is waiting: read again without sleeping

    def __bool__(self) -> bool:
        return bool(self.lines or self.reset)


@dataclass
class EventBatch:
    events: list[dict[str, Any]] = field(default_factory=list)
    reset: bool = False
    bad_lines: int = 0  # lines that are not JSON objects of a known schema version
    more: bool = False

    def __bool__(self) -> bool:
        return bool(self.events or self.reset or self.bad_lines)


class EventTail:
    """Parsed events from an events.jsonl, as they are appended."""

    def __init__(self, path: str | os.PathLike[str], offset: int = 0):
        self.lines = LineTail(path, offset)

    def read(self) -> EventBatch:
        got = self.lines.read()
        batch = EventBatch(reset=got.reset, more=got.more)
        for line in got.lines:
            if not line.strip():
                continue
            d = parse_event(line)
            if d is None:
                batch.bad_lines += 1
            else:
                batch.events.append(d)
        return batch


def parse_event(line: str | bytes) -> dict[str, Any] | None:
    """One events.jsonl line as a dict, or None if it is not JSON, not an event, or of a schema version this
    reader does not know (a reader rejects those rather than misread them: docs/events.md)."""
    try:
        d = json.loads(line)
    except ValueError:
        return None
    return d if isinstance(d, dict) and d.get("v") in READABLE_VERSIONS and "type" in d else None


Batch = TypeVar("Batch", LineBatch, EventBatch)


def follow(
    read: Callable[[], Batch], deliver: Callable[[Batch], object], stop: threading.Event, interval: float = 0.25
) -> None:
    """Poll `read()` until `stop` is set, handing every non-empty batch to `deliver` (which posts it to
    the UI thread). Meant to run in a worker thread: the UI never blocks on file I/O."""
    while not stop.is_set():
        batch = read()
        if batch:
            deliver(batch)
        if not batch.more:
            stop.wait(interval)
