"""The compare view's table: one row per run with its state, progress, best mAP50-95, speed, GPU, wall time,
and one column per argument whose value is not the same in every run."""

from __future__ import annotations

from rich.text import Text
from textual.color import Color
from textual.widgets import DataTable

from libreyolo_console.compare import CompareRun, arg_text
from libreyolo_console.widgets.fmt import duration, num
from libreyolo_console.widgets.plots import series_styles
from libreyolo_console.widgets.run_list import status_text

COLUMNS = ("run", "state", "epoch", "mAP50-95", "img/s", "GPU", "wall")

Row = tuple[str, ...]


def row_cells(run: CompareRun, keys: list[str]) -> Row:
    """The row's cells as plain text (the run column without its marker)."""
    img_s = run.img_s
    return (
        run.name,
        run.status,
        run.epoch_text,
        num(run.best_map) + (f" {run.best_label}" if run.best_label and run.best_map is not None else ""),
        "-" if img_s is None else f"{img_s:.0f}",
        run.gpu,
        duration(run.wall_s),
        *(arg_text(run, k) for k in keys),
    )


class CompareTable(DataTable[Text | str]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)
        self.rows_shown: list[Row] = []
        self._columns_shown: tuple[str, ...] = ()

    def show_runs(self, runs: list[CompareRun], keys: list[str]) -> None:
        rows = [row_cells(r, keys) for r in runs]
        columns = (*COLUMNS, *keys)
        if rows == self.rows_shown and columns == self._columns_shown:
            return
        cursor = self.cursor_row
        if columns != self._columns_shown:
            self.clear(columns=True)
            for col in columns:
                self.add_column(col, key=col)
            self._columns_shown = columns
        else:
            self.clear()
        styles = series_styles(self.app, len(runs))
        for i, (row, (marker, rgb)) in enumerate(zip(rows, styles, strict=True)):
            # the run's marker and colour, as in the plots' legends: the row says which curve is which
            name = Text(f"{marker} {row[0]}")
            name.stylize(f"bold {Color(*rgb).hex}", 0, 1)
            self.add_row(name, status_text(row[1]), *row[2:], key=str(i))
        self.rows_shown = rows
        if rows:
            self.move_cursor(row=min(cursor, len(rows) - 1))
