"""The per-class tables: the best epoch's of one run (the Metrics panel) and two runs' difference (the compare
view). What they show is console/perclass.py's."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from libreyolo_console.compare import CompareRun
from libreyolo_console.perclass import COLUMNS, DIFF_COLUMNS, Cells, best_rows, diff, diff_note, heading, table_cells
from libreyolo_console.state import RunState


class _Table(DataTable[str | Text]):
    """A table whose cells are redrawn only when they change (the run view redraws 4 times a second)."""

    def __init__(self) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True)
        self.shown: list[Cells] = []
        self._header: tuple[str, ...] = ()

    def show(self, header: tuple[str, ...], rows: list[Cells], right_from: int = 1) -> None:
        if header == self._header and rows == self.shown:
            return
        self.clear(columns=True)
        for i, h in enumerate(header):
            self.add_column(Text(h, justify="right" if i >= right_from else "left"), key=h)
        for row in rows:
            self.add_row(*(Text(c, justify="right") if i >= right_from else c for i, c in enumerate(row)))
        self._header, self.shown = header, rows


class PerClassPanel(Vertical):
    """The Metrics panel's per-class table: the best epoch's rows, as `libreyolo val` prints them."""

    DEFAULT_CSS = """
    PerClassPanel { height: 1fr; }
    PerClassPanel > Static { height: auto; padding: 0 1; color: $text-muted; }
    PerClassPanel > DataTable { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="per-class-note")
        yield _Table()

    def show_state(self, state: RunState) -> None:
        self.query_one(Static).update(heading(state))
        best, rows = best_rows(state)
        table = self.query_one(_Table)
        table.display = rows is not None
        table.show(COLUMNS, table_cells(best, rows) if best is not None and rows is not None else [])

    @property
    def shown(self) -> list[Cells]:
        return self.query_one(_Table).shown


class PerClassDiff(Vertical):
    """The compare view's per-class difference of two runs (A, B): mAP50-95 of each and B - A, per class."""

    DEFAULT_CSS = """
    PerClassDiff { height: 1fr; }
    PerClassDiff > Static { height: auto; padding: 0 1; }
    PerClassDiff > DataTable { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="per-class-diff-note")
        yield _Table()

    def show_runs(self, a: CompareRun, b: CompareRun) -> None:
        self.query_one(Static).update(diff_note(a.name, a.state, b.name, b.state))
        rows_a, rows_b = best_rows(a.state)[1], best_rows(b.state)[1]
        table = self.query_one(_Table)
        table.display = rows_a is not None and rows_b is not None
        cells = [r.cells() for r in diff(rows_a, rows_b)] if rows_a is not None and rows_b is not None else []
        table.show(DIFF_COLUMNS, cells)

    @property
    def shown(self) -> list[Cells]:
        return self.query_one(_Table).shown
