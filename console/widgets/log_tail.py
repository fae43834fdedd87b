"""Log: the tail of the run's stdout.log (what `libreyolo train` printed), followed live. Long lines wrap at the
panel's width (w toggles: one line per line, scrolled sideways)."""

from __future__ import annotations

import textwrap
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Log

from libreyolo_console.tail import LineBatch, LineTail

if TYPE_CHECKING:
    from typing_extensions import Self  # (typing.Self is 3.11+; the console supports 3.10)

START_BYTES = 256 << 10  # on attach, show the last 256 KiB, not a whole week of output


def clean(line: str) -> str:
    """A progress line redrawn with carriage returns shows its final state; colour codes are dropped."""
    line = line.rstrip("\r")
    if "\r" in line:
        line = line.rsplit("\r", 1)[-1]
    return Text.from_ansi(line).plain if "\x1b" in line else line


def last_lines(path: str | Path, n: int = 12) -> list[str]:
    """The last `n` lines of a log file (for a crashed run's note)."""
    return [clean(line) for line in LineTail(path, from_end=16 << 10).read().lines][-n:]


MAX_LINES = 5000


def wrap_line(line: str, width: int) -> list[str]:
    """One log line as the rows it takes at this width: words kept whole where they fit."""
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, break_long_words=True, break_on_hyphens=False) or [""]


class LogTail(Log):
    """Textual's Log draws only the rows in view (a re-attach writes thousands of lines at once, in
    milliseconds); wrapping is done here, by the panel's width, and redone when that or the toggle changes."""

    def __init__(self, wrap: bool = True, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=MAX_LINES, highlight=False, id=id, classes=classes)
        self.wrap = wrap
        self.kept: deque[str] = deque(maxlen=MAX_LINES)  # the lines as read: a new width or toggle lays them out again
        self._wrap_width = 0  # the width the rows were wrapped at (0: not laid out yet)

    def _rows(self, lines: list[str]) -> list[str]:
        if not self.wrap or self._wrap_width <= 0:
            return lines
        return [row for line in lines for row in wrap_line(line, self._wrap_width)]

    def write_line(self, line: str, scroll_end: bool | None = None) -> Self:
        self.add_lines([line])
        return self

    def add_lines(self, lines: list[str]) -> None:
        """Lines as read (kept for a later re-layout), written as the rows they take."""
        self.kept.extend(lines)
        self.write_lines(self._rows(lines))

    def add_batch(self, batch: LineBatch) -> None:
        if batch.reset:
            self.kept.clear()
            self.clear()
        if batch.lines:
            self.add_lines([clean(line) for line in batch.lines])

    def relayout(self) -> None:
        lines = list(self.kept)
        self.kept.clear()
        self.clear()
        self.add_lines(lines)

    def on_resize(self) -> None:
        # (the size, not the content region, which can lag behind it here) less padding and a scrollbar's room
        width = max(self.size.width - self.styles.gutter.width - self.styles.scrollbar_size_vertical, 0)
        if width != self._wrap_width:
            self._wrap_width = width
            if self.wrap:
                self.relayout()

    def toggle_wrap(self) -> bool:
        """Wrap long lines, or give each its own row (scrolled sideways); -> wrapping now."""
        self.wrap = not self.wrap
        self.relayout()
        return self.wrap
