"""CUDA graph: the mode the run uses and why (run_start), then every capture / fallback / invalidation /
eager-shape / recapture decision, with shape and reason (graph events)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from libreyolo_console.state import RunState
from libreyolo_console.widgets.fmt import mb, off_gpu

EMPTY = "No CUDA-graph events: an eager run has none; a graph run reports its first capture after a few steps."


def empty_hint(state: RunState) -> str:
    device = off_gpu(state.start)
    if device is None:
        return EMPTY
    return (
        f"No CUDA-graph events: CUDA graphs run on NVIDIA GPUs, and this run is on {device}, so it trains eager. "
        "On a GPU, cuda_graph=auto (the default) captures the step, and every capture, fallback and re-capture "
        "is listed here with its shape and reason."
    )


# Failures stand out by a word as well as a colour.
ACTION_STYLE = {
    "capture": "green",
    "recapture": "green",
    "fallback": "bold red",
    "step_down": "bold yellow",
    "invalidate": "yellow",
    "eager_shape": "cyan",
}


def _modes(start: dict[str, Any]) -> tuple[str, str | None]:
    """(the cuda_graph key as given, the mode the run uses: full | true | false; None in a version-1 file)."""
    return str(start.get("cuda_graph", "?")).lower(), start.get("cuda_graph_mode")


def mode_short(state: RunState) -> str:
    """For the status line: 'cuda_graph full (auto)'; '' for an eager run nobody asked graphs of."""
    if state.start is None:
        return ""
    asked, mode = _modes(state.start)
    if mode is None:  # version 1: only the key as given
        return "" if asked == "false" else f"cuda_graph {asked}"
    fb = state.fallback
    if fb is not None:
        return "cuda_graph true (step-down)" if fb["action"] == "step_down" else "cuda_graph false (fallback)"
    if mode == "false" and asked in ("false", "auto"):
        return ""
    return f"cuda_graph {mode}" + (f" ({asked})" if asked != mode else "")


def mode_line(state: RunState) -> str:
    """The mode the run uses and why, e.g. 'cuda_graph full (auto): the whole step in one graph (...)'."""
    if state.start is None:
        return "cuda_graph: the run has not started yet"
    asked, mode = _modes(state.start)
    if mode is None:
        return (
            f"cuda_graph {asked}: the key as given "
            "(this run's events file, version 1, does not say which mode it used or why)"
        )
    reason = str(state.start.get("cuda_graph_reason", "")).removeprefix(f"cuda_graph={asked}: ")
    line = f"cuda_graph {mode}" + (f" ({asked})" if asked != mode else "") + (f": {reason}" if reason else "")
    fb = state.fallback
    if fb is not None:
        then = "the network graph (cuda_graph true)" if fb["action"] == "step_down" else "eager"
        line += f"\nthen {then} from +{_since(state, fb)}: {fb['reason']}"
    return line


def _since(state: RunState, g: dict[str, Any]) -> str:
    return f"{g['t'] - (state.t0 or g['t']):.1f}s"


def _delta(v: float | None) -> str:
    return "" if v is None else ("+" if v >= 0 else "-") + mb(abs(v))


HEADER = ("time", "action", "mode", "shape", "Δalloc", "Δreserved")
_RIGHT = (True, False, False, False, True, True)
WIDE = 110  # from this width each event is one table row; below it, its reason gets a line of its own


def _fields(state: RunState, g: dict[str, Any]) -> tuple[str, ...]:
    shape = "x".join(map(str, g["shape"])) if g.get("shape") else "-"
    return (
        "+" + _since(state, g),
        g["action"],
        g["mode"],
        shape,
        _delta(g.get("delta_allocated_mb")),
        _delta(g.get("delta_reserved_mb")),
    )


def graph_table(state: RunState) -> Table:
    t = Table(box=None, padding=(0, 1), header_style="bold", expand=True)
    for name, right in zip(HEADER, _RIGHT, strict=True):
        t.add_column(name, justify="right" if right else "left", no_wrap=True)
    t.add_column("reason", ratio=1)
    for g in state.graphs:
        when, action, *rest = _fields(state, g)
        t.add_row(when, Text(action, style=ACTION_STYLE.get(action, "")), *rest, g["reason"])
    return t


def graph_lines(state: RunState) -> Group:
    """For narrow terminals: the same columns, each event's reason on the line below it (a reason
    column would be a few characters wide at 80 columns)."""
    rows = [_fields(state, g) for g in state.graphs]
    widths = [max(map(len, col)) for col in zip(HEADER, *rows, strict=True)]

    def line(cells: tuple[str, ...], style: str = "") -> Text:
        t = Text(" ")
        for i, (c, w, right) in enumerate(zip(cells, widths, _RIGHT, strict=True)):
            t.append(c.rjust(w) if right else c.ljust(w), style or (ACTION_STYLE.get(c, "") if i == 1 else ""))
            t.append("  ")
        return t

    out: list[RenderableType] = [line(HEADER, "bold")]
    for g, cells in zip(state.graphs, rows, strict=True):
        out += [line(cells), Padding(Text(g["reason"]), (0, 0, 0, widths[0] + 3))]
    return Group(*out)


class GraphLog(VerticalScroll):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[str, int, bool] | None = None
        self._state: RunState | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="graph-mode")
        yield Static(EMPTY, id="graph-body")

    def watch_virtual_size(self) -> None:
        # the newest events in view once the new content is laid out (the table grew, or the panel was shown at
        # its full width): a scroll_end requested with the update itself could run before that layout
        self.scroll_end(animate=False)

    def on_resize(self) -> None:
        if self._state is not None:
            self.show_state(self._state)

    def show_state(self, state: RunState) -> None:
        self._state = state
        line, wide = mode_line(state), self.size.width >= WIDE
        if (line, len(state.graphs), wide) == self._shown:
            return
        self._shown = (line, len(state.graphs), wide)
        self.query_one("#graph-mode", Static).update(Text(line))
        body = empty_hint(state) if not state.graphs else graph_table(state) if wide else graph_lines(state)
        self.query_one("#graph-body", Static).update(body)
