"""Log: the tail of the run's stdout.log (what `libreyolo train` printed), followed live. Long lines wrap at the
panel's width (w toggles: one line per line, scrolled sideways)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from rich.text import Text
from textual.widgets import RichLog

from libreyolo_console.tail import LineBatch, LineTail

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


class LogTail(RichLog):
    def __init__(self, wrap: bool = True, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=MAX_LINES, wrap=wrap, highlight=False, markup=False, id=id, classes=classes)
        self.kept: deque[str] = deque(maxlen=MAX_LINES)  # the lines as read: a wrap toggle lays them out again

    def write_line(self, line: str) -> None:
        self.kept.append(line)
        self.write(Text(line), scroll_end=True)

    def add_batch(self, batch: LineBatch) -> None:
        if batch.reset:
            self.kept.clear()
            self.clear()
        for line in batch.lines:
            self.write_line(clean(line))

    def toggle_wrap(self) -> bool:
        """Wrap long lines, or give each its own line (scrolled sideways); -> wrapping now."""
        self.wrap = not self.wrap
        lines = list(self.kept)
        self.kept.clear()
        self.clear()
        for line in lines:
            self.write_line(line)
        return self.wrap
