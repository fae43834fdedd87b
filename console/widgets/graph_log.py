"""CUDA graph: every capture / fallback / invalidation / eager-shape / recapture decision, with shape and reason."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.state import RunState
from console.widgets.fmt import mb

EMPTY = "No CUDA-graph events: the run uses cuda_graph=false, is on CPU, or has not reached its first step."
# Failures stand out by a word as well as a colour.
ACTION_STYLE = {"capture": "green", "recapture": "green", "fallback": "bold red", "invalidate": "yellow", "eager_shape": "cyan"}


def _delta(v: float | None) -> str:
    return "" if v is None else ("+" if v >= 0 else "-") + mb(abs(v))


def graph_table(state: RunState) -> Table:
    t = Table(box=None, padding=(0, 1), header_style="bold", expand=True)
    t.add_column("time", justify="right", no_wrap=True)
    t.add_column("action", no_wrap=True)
    t.add_column("mode", no_wrap=True)
    t.add_column("shape", no_wrap=True)
    t.add_column("Δalloc", justify="right", no_wrap=True)
    t.add_column("Δreserved", justify="right", no_wrap=True)
    t.add_column("reason", ratio=1)
    for g in state.graphs:
        shape = "x".join(map(str, g["shape"])) if g.get("shape") else "-"
        when = f"+{g['t'] - (state.t0 or g['t']):.1f}s"
        t.add_row(when, Text(g["action"], style=ACTION_STYLE.get(g["action"], "")), g["mode"], shape,
                  _delta(g.get("delta_allocated_mb")), _delta(g.get("delta_reserved_mb")), g["reason"])
    return t


class GraphLog(VerticalScroll):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self._shown = -1

    def compose(self) -> ComposeResult:
        yield Static(EMPTY, id="graph-body")

    def show_state(self, state: RunState) -> None:
        if len(state.graphs) == self._shown:
            return
        self._shown = len(state.graphs)
        self.query_one("#graph-body", Static).update(graph_table(state) if state.graphs else EMPTY)
        self.scroll_end(animate=False)
