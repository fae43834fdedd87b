"""The run's processes: the launcher, one line per DDP rank, and the data-loader workers."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from libreyolo_console.supervisor import ProcInfo


class ProcessPanel(Widget):
    DEFAULT_CSS = "ProcessPanel { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.procs: list[ProcInfo] = []
        self.note = "not running"

    def show_processes(self, procs: list[ProcInfo], note: str = "not running") -> None:
        self.procs, self.note = procs, note
        self.refresh(layout=True)

    def render(self) -> Table | Text:
        if not self.procs:
            return Text(f"processes: {self.note}")
        t = Table(box=None, padding=(0, 2), header_style="bold")
        for col in ("process", "pid", "cpu", "memory"):
            t.add_column(col, justify="right" if col != "process" else "left")
        ranks = [p for p in self.procs if p.role != "worker"]
        workers = [p for p in self.procs if p.role == "worker"]
        for p in ranks:
            t.add_row(p.role, str(p.pid), f"{p.cpu_percent:.0f}%", f"{p.rss_mb:.0f} MB")
        if workers:
            t.add_row(
                f"{len(workers)} loader worker{'s' if len(workers) != 1 else ''}",
                "",
                f"{sum(w.cpu_percent for w in workers):.0f}%",
                f"{sum(w.rss_mb for w in workers):.0f} MB",
            )
        return t
