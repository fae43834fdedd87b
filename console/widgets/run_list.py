"""The run list: every run under the project, newest first, with its state."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import DataTable

from libreyolo_console.runs import RunSummary

# The state is always a word; colour only repeats it (NO_COLOR, 16 colours).
STATUS_STYLE = {
    "live": "bold green",
    "finished": "",
    "early_stop": "cyan",
    "profiled": "cyan",
    "interrupted": "yellow",
    "failed": "bold red",
    "crashed": "bold red",
}
COLUMNS = ("run", "state", "model", "epochs done", "mAP50-95", "started")  # done: as the run view counts


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


class RunList(DataTable):
    def __init__(self, **kw: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.runs: dict[str, RunSummary] = {}

    def on_mount(self) -> None:
        for col in COLUMNS:
            self.add_column(col, key=col)

    def show_runs(self, runs: list[RunSummary]) -> None:
        selected = self.selected
        self.runs = {str(r.run_dir): r for r in runs}
        self.clear()
        for r in runs:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
            epoch = f"{r.epoch}/{r.epochs}" if r.epochs else "-"
            best = "-" if r.best_map is None else f"{r.best_map:.3f}"
            self.add_row(r.name, status_text(r.status), r.model, epoch, best, started, key=str(r.run_dir))
        if selected is not None and str(selected.run_dir) in self.runs:
            self.move_cursor(row=self.get_row_index(str(selected.run_dir)))

    @property
    def selected(self) -> RunSummary | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self.runs.get(key) if key is not None else None
