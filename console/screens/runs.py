"""The run list: every run under the project with its state; open one, or start a new one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import Worker, WorkerState

from libreyolo_console.runs import RunSummary, find_runs
from libreyolo_console.screens.compare import CompareScreen
from libreyolo_console.widgets.run_list import RunList

if TYPE_CHECKING:
    from libreyolo_console.app import ConsoleApp

REFRESH_S = 2.0


class RunsScreen(Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open"),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("n", "new_run", "New run"),
        Binding("f5,ctrl+r", "refresh", "Refresh", key_display="f5"),
    ]

    if TYPE_CHECKING:  # (how Textual types `app` itself: this screen runs in the ConsoleApp)
        app = getters.app(ConsoleApp)

    def __init__(self, project: Path) -> None:
        super().__init__()
        self.project = project
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="")
        yield Static(id="runs-title")
        yield RunList(id="run-list")
        yield Static(id="runs-empty")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"runs in {self.project}"
        self.query_one("#runs-title", Static).update(
            f"Runs under {self.project}: enter opens one (live runs are re-attached), n starts a new one."
        )
        self.action_refresh()
        self.set_interval(REFRESH_S, self._poll)

    def _poll(self) -> None:
        # the list stays under a run view on the screen stack: scan only while it is what the user sees
        if self.is_current:
            self.action_refresh()

    def on_screen_resume(self) -> None:
        if self.loaded:  # back from a run view: show what changed meanwhile at once
            self.action_refresh()

    def action_refresh(self) -> None:
        # find_runs reads the end of every events.jsonl and checks pids: off the UI thread
        self.run_worker(lambda: find_runs(self.project), thread=True, exclusive=True, group="find-runs")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "find-runs" and event.state == WorkerState.SUCCESS:
            runs: list[RunSummary] | None = event.worker.result  # (find_runs' list, once it succeeded)
            if runs is not None:
                self.show_runs(runs)

    def show_runs(self, runs: list[RunSummary]) -> None:
        self.query_one(RunList).show_runs(runs)
        self.loaded = True
        empty = self.query_one("#runs-empty", Static)
        empty.display = not runs
        empty.update(f"No runs under {self.project} yet. Press n to start one.")

    def action_open(self) -> None:
        run = self.query_one(RunList).selected
        if run is not None:
            self.app.open_run(run.run_dir)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_mark(self) -> None:
        self.query_one(RunList).toggle_mark()

    def action_compare(self) -> None:
        """The marked runs side by side; every listed run when none is marked."""
        run_list = self.query_one(RunList)
        runs = run_list.marked_runs or list(run_list.runs.values())
        if not runs:
            self.notify("no runs to compare yet", severity="warning")
            return
        self.app.push_screen(CompareScreen([(r.run_dir, r.name) for r in runs]))

    def action_new_run(self) -> None:
        self.app.new_run()
