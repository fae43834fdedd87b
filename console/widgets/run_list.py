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
MARK = "* "  # before the name of a run marked for comparing


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


class RunList(DataTable[str | Text]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)
        self.runs: dict[str, RunSummary] = {}
        self.marked: set[str] = set()  # run folders (as the row keys) marked for comparing

    def on_mount(self) -> None:
        for col in COLUMNS:
            self.add_column(col, key=col)

    def show_runs(self, runs: list[RunSummary]) -> None:
        selected = self.selected
        self.runs = {str(r.run_dir): r for r in runs}
        self.marked &= set(self.runs)
        self.clear()
        for r in runs:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
            epoch = f"{r.epoch}/{r.epochs}" if r.epochs else "-"
            best = "-" if r.best_map is None else f"{r.best_map:.3f}" + (f" {r.best_label}" if r.best_label else "")
            self.add_row(self._run_label(r), status_text(r.status), r.model, epoch, best, started, key=str(r.run_dir))
        if selected is not None and str(selected.run_dir) in self.runs:
            self.move_cursor(row=self.get_row_index(str(selected.run_dir)))

    @property
    def selected(self) -> RunSummary | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self.runs.get(key) if key is not None else None

    def _run_label(self, run: RunSummary) -> str:
        return f"{MARK}{run.name}" if str(run.run_dir) in self.marked else run.name

    def toggle_mark(self) -> None:
        """Mark the highlighted run for comparing (or unmark it), then highlight the next one."""
        run = self.selected
        if run is None:
            return
        key = str(run.run_dir)
        self.marked ^= {key}
        self.update_cell(key, "run", self._run_label(run), update_width=True)
        self.move_cursor(row=self.cursor_row + 1)

    @property
    def marked_runs(self) -> list[RunSummary]:
        """The marked runs, in the list's order."""
        return [r for key, r in self.runs.items() if key in self.marked]
