"""The compare view: several runs in one table and two overlaid plots (training loss, mAP50-95), finished,
crashed and live alike; `p` puts the per-class difference of two runs in the plots' place (A the first run, B the
one under the table's cursor, or the second). One worker thread follows every run's events.jsonl from where it last
read, so a live run's row and curves grow as its file does."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from libreyolo_console.compare import (
    TOTAL,
    CompareRun,
    differing_keys,
    follow_all,
    loss_choices,
    loss_note,
)
from libreyolo_console.runs import EVENTS
from libreyolo_console.tail import EventBatch, EventTail
from libreyolo_console.widgets.compare_plots import ComparePlot
from libreyolo_console.widgets.compare_table import CompareTable
from libreyolo_console.widgets.perclass import PerClassDiff


class CompareEventsRead(Message):
    def __init__(self, index: int, batch: EventBatch) -> None:
        super().__init__()
        self.index, self.batch = index, batch


class CompareScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "back", "Runs"),
        Binding("l", "next_loss", "Loss term"),
        Binding("p", "per_class", "Per class"),
    ]
    DEFAULT_CSS = """
    #compare-note { height: auto; max-height: 3; padding: 0 1; background: $panel; }
    CompareTable { height: auto; max-height: 12; }
    #compare-plots { height: 1fr; min-height: 8; }
    ComparePlot { width: 1fr; }
    #compare-per-class { display: none; min-height: 8; }
    """

    def __init__(self, runs: list[tuple[Path, str]]) -> None:
        """`runs`: (run folder, name to show) of each run to compare, in the order to show them."""
        super().__init__()
        self.runs = [CompareRun(Path(d), name) for d, name in runs]
        self.loss_choice = TOTAL
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="")
        yield Static(id="compare-note")
        yield CompareTable(id="compare-table")
        with Horizontal(id="compare-plots"):
            yield ComparePlot(id="compare-loss")
            yield ComparePlot(id="compare-map")
        yield PerClassDiff(id="compare-per-class")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"comparing {len(self.runs)} run(s)"
        self.run_worker(self._follow, thread=True, group="compare-tail")
        self.set_interval(0.5, self.redraw)
        self.set_interval(1.0, self.check_processes)
        self.redraw()

    def _follow(self) -> None:
        tails = [EventTail(r.run_dir / EVENTS) for r in self.runs]
        follow_all(tails, lambda i, b: self.post_message(CompareEventsRead(i, b)), get_current_worker().cancelled_event)

    def on_compare_events_read(self, message: CompareEventsRead) -> None:
        run = self.runs[message.index]
        run.apply(message.batch.events, reset=message.batch.reset)
        run.check_status()
        self._dirty = True

    def check_processes(self) -> None:
        """Once a second: a live run may have ended or died (it writes no event when killed)."""
        before = [r.status for r in self.runs]
        if [r.check_status() for r in self.runs] != before:
            self._dirty = True

    def redraw(self) -> None:
        if not self._dirty or not self.is_current:
            return
        self._dirty = False
        runs, choice = self.runs, self.loss_choice
        keys = differing_keys(runs)
        differs = f"differs: {', '.join(keys)}" if keys else "no argument differs between them"
        self.query_one("#compare-note", Static).update(f"{loss_note(runs, choice)}\n{differs}")
        self.query_one(CompareTable).show_runs(runs, keys)
        n = len(runs)
        self.query_one("#compare-loss", ComparePlot).show_series(
            f"training loss ({choice})", [(i, r.name, r.loss_curve(choice)) for i, r in enumerate(runs)], n
        )
        self.query_one("#compare-map", ComparePlot).show_series(
            "mAP50-95", [(i, r.name, r.map_curve()) for i, r in enumerate(runs)], n
        )
        pair = self.per_class_pair()
        if pair is not None:
            self.query_one(PerClassDiff).show_runs(*pair)

    def per_class_pair(self) -> tuple[CompareRun, CompareRun] | None:
        """(A, B) of the per-class difference: the first run, and the one under the table's cursor (the second
        while the cursor is on the first); None with fewer than two runs."""
        if len(self.runs) < 2:
            return None
        row = self.query_one(CompareTable).cursor_row
        return self.runs[0], self.runs[row if 0 < row < len(self.runs) else 1]

    def on_data_table_row_highlighted(self, _: DataTable.RowHighlighted) -> None:
        self._dirty = True  # B follows the cursor

    def action_per_class(self) -> None:
        """Toggle the plots and the per-class difference."""
        if len(self.runs) < 2:
            self.notify("the per-class difference needs two runs", severity="warning")
            return
        diff = self.query_one(PerClassDiff)
        diff.display = not diff.display
        self.query_one("#compare-plots").display = not diff.display
        self._dirty = True
        self.redraw()

    def on_screen_resume(self) -> None:
        self._dirty = True

    def action_next_loss(self) -> None:
        choices = loss_choices(self.runs)
        i = choices.index(self.loss_choice) if self.loss_choice in choices else -1
        self.loss_choice = choices[(i + 1) % len(choices)]
        self._dirty = True
        self.redraw()

    def action_back(self) -> None:
        self.app.pop_screen()
