"""Log: the tail of the run's stdout.log (what `libreyolo train` printed), followed live."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Log

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


class LogTail(Log):
    def __init__(self, **kw: object) -> None:
        super().__init__(max_lines=5000, highlight=False, **kw)

    def add_batch(self, batch: LineBatch) -> None:
        if batch.reset:
            self.clear()
        if batch.lines:
            self.write_lines([clean(line) for line in batch.lines])
