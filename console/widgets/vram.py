"""VRAM: what each CUDA-graph capture cost (allocated and reserved, before -> after) and the peak per epoch."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from libreyolo_console.state import RunState
from libreyolo_console.widgets.fmt import mb, off_gpu

EMPTY = "No VRAM events: peaks are reported per epoch on CUDA devices, capture costs when cuda_graph is on."


def empty_hint(state: RunState) -> str:
    device = off_gpu(state.start)
    if device is None:
        return EMPTY
    return (
        f"No VRAM events: VRAM is a GPU's memory, and this run is on {device}. On a CUDA device the peak "
        "allocated and reserved memory per epoch, and what each CUDA-graph capture cost, appear here."
    )


def _change(before: float | None, after: float | None, delta: float | None) -> str:
    if before is None and after is None and delta is None:
        return "-"
    d = delta if delta is not None else (after - before if before is not None and after is not None else None)
    sign = "" if d is None else (" (+" if d >= 0 else " (-") + mb(abs(d)) + ")"
    return f"{mb(before)} -> {mb(after)}{sign}"


def vram_view(state: RunState) -> Group:
    parts: list[Table | Text] = []
    captures = [
        g for g in state.graphs if any(g.get(k) is not None for k in ("allocated_before_mb", "delta_allocated_mb"))
    ]
    if captures:
        t = Table(title="graph captures", title_justify="left", box=None, padding=(0, 1), header_style="bold")
        for col in ("action", "allocated", "reserved"):
            t.add_column(col, no_wrap=True, min_width=9 if col == "action" else None)
        for g in captures:  # the shape and the reason are in the graph log above
            t.add_row(
                g["action"],
                _change(g.get("allocated_before_mb"), g.get("allocated_after_mb"), g.get("delta_allocated_mb")),
                _change(g.get("reserved_before_mb"), g.get("reserved_after_mb"), g.get("delta_reserved_mb")),
            )
        parts.append(t)
    if state.vram:
        t = Table(title="peak per epoch", title_justify="left", box=None, padding=(0, 1), header_style="bold")
        for col in ("epoch", "allocated", "reserved", "vs previous", "device"):
            t.add_column(col, justify="right" if col != "device" else "left", no_wrap=True)
        prev = None
        for v in sorted(state.vram, key=lambda v: v["epoch"]):
            # a reserved peak that keeps growing epoch after epoch is the usual sign of fragmentation or a leak
            grow = (
                ""
                if prev is None
                else ("+" if v["peak_reserved_mb"] >= prev else "-") + mb(abs(v["peak_reserved_mb"] - prev))
            )
            t.add_row(str(v["epoch"] + 1), mb(v["peak_allocated_mb"]), mb(v["peak_reserved_mb"]), grow, v["device"])
            prev = v["peak_reserved_mb"]
        parts.append(t)
    return Group(*parts) if parts else Group(Text(empty_hint(state)))


class VramPanel(VerticalScroll):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[int, int, str | None] = (-1, -1, None)

    def compose(self) -> ComposeResult:
        yield Static(EMPTY, id="vram-body")

    def show_state(self, state: RunState) -> None:
        key = (len(state.graphs), len(state.vram), off_gpu(state.start))
        if key == self._shown:
            return
        self._shown = key
        self.query_one("#vram-body", Static).update(vram_view(state))
