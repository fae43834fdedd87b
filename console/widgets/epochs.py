"""The per-epoch table: training losses (one column per loss term of the run's family), validation
metrics, epoch time, validation time and speed."""

from __future__ import annotations

from textual import events
from textual.widgets import DataTable

from libreyolo.api import DETECT
from libreyolo_console.state import EpochRow, RunState
from libreyolo_console.widgets.fmt import duration, num, seconds

METRICS = DETECT.labels  # a detection run's, the columns shown before run_start is read
TIMES = ("time", "val", "img/s")
_SCROLLBAR = 2  # columns a vertical scrollbar takes once the epochs outnumber the rows


def columns(terms: tuple[str, ...], metrics: tuple[str, ...] = METRICS) -> tuple[str, ...]:
    """terms: the loss terms; metrics: the task's metric headings (RunState.labels)."""
    return ("epoch", *terms, *metrics, *TIMES)


def val_time(r: EpochRow, with_eval: bool = True) -> str:
    """val.time_s (what validation held the training loop) + val.eval_s (the COCO evaluation, which may
    have run in the background): '0.18s+0.40s'. A version-1 file has only the first."""
    if r.val_s is None:
        return "-"
    return seconds(r.val_s) + (f"+{seconds(r.eval_s)}" if with_eval and r.eval_s is not None else "")


def speed(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def cells(
    r: EpochRow, terms: tuple[str, ...], with_eval: bool = True, metrics: tuple[str, ...] = DETECT.metric_names
) -> tuple[str, ...]:
    """metrics: the task's metric names (RunState.metrics), in the order of the headings."""
    return (
        str(r.epoch + 1),
        *(num(r.losses.get(t)) for t in terms),
        *(num(r.metrics.get(m)) for m in metrics),
        duration(r.time_s),
        val_time(r, with_eval),
        speed(r.img_s),
    )


def table_width(header: tuple[str, ...], rows: list[tuple[str, ...]], padding: int = 1) -> int:
    """The columns a DataTable needs for these cells (each column as wide as its widest cell, plus padding)."""
    return sum(max(len(c) for c in col) + 2 * padding for col in zip(header, *rows))


class EpochTable(DataTable[str]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)
        self._columns: tuple[str, ...] = ()
        self._shown: list[tuple[str, ...]] = []
        self._state: RunState | None = None

    def on_mount(self) -> None:
        self._set_columns(columns(()))

    def _set_columns(self, header: tuple[str, ...]) -> None:
        self._columns = header
        self.clear(columns=True)
        self.add_columns(*header)
        self._shown = []

    def on_resize(self, _: events.Resize) -> None:
        if self._state is not None:
            self.show_state(self._state)  # the evaluation time may now fit, or no longer
        if self.row_count and self.cursor_row >= self.row_count - 1:
            # following the newest epoch: rows that arrived while the tab was hidden (no size) scroll into view now
            self.call_after_refresh(self.scroll_end, animate=False)

    def show_state(self, state: RunState) -> None:
        self._state = state
        header = columns(state.terms, state.labels)
        rows = [r for _, r in sorted(state.rows.items())]
        shown = [cells(r, state.terms, metrics=state.metrics) for r in rows]
        if table_width(header, shown, self.cell_padding) > self.size.width - _SCROLLBAR:
            shown = [
                cells(r, state.terms, with_eval=False, metrics=state.metrics) for r in rows
            ]  # the evaluation time only where there is room
        if header == self._columns and shown == self._shown:
            return  # step events arrive often; the table only changes at epoch ends
        follow = self.cursor_row >= self.row_count - 1  # keep the newest epoch in view unless the user moved up
        # new columns every time: the terms may have become known (or a re-attach found others), and a
        # column keeps the widest width it ever had, which a narrower val cell would not give back
        self._set_columns(header)
        self._shown = shown
        for row in shown:
            self.add_row(*row)
        if follow and rows:
            self.move_cursor(row=len(rows) - 1)
            # its scroll once the new rows are laid out: moved before that layout, the cursor did not scroll them
            # into view in 2 of 3 clean-clone CI runs (the recorded snapshot shows the newest epoch)
            self.call_after_refresh(self.scroll_end, animate=False)
