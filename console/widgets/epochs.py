"""The per-epoch table: training losses, validation metrics, time and speed."""

from __future__ import annotations

from dataclasses import astuple

from textual.widgets import DataTable

from console.state import RunState
from console.widgets.fmt import duration, num

COLUMNS = ("epoch", "box", "cls", "dfl", "P", "R", "mAP50", "mAP50-95", "time", "img/s")


class EpochTable(DataTable):
    def __init__(self, **kw: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._shown: list[tuple] = []

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show_state(self, state: RunState) -> None:
        rows = [r for _, r in sorted(state.rows.items())]
        shown = [astuple(r) for r in rows]
        if shown == self._shown:
            return  # step events arrive often; the table only changes at epoch ends
        self._shown = shown
        follow = self.cursor_row >= self.row_count - 1  # keep the newest epoch in view unless the user moved up
        self.clear()
        for r in rows:
            self.add_row(str(r.epoch + 1), num(r.box), num(r.cls), num(r.dfl), num(r.precision), num(r.recall),
                         num(r.map50), num(r.map), duration(r.time_s), "-" if r.img_s is None else f"{r.img_s:.1f}")
        if follow and rows:
            self.move_cursor(row=len(rows) - 1)
