"""Profiler: the verdict, why, the levers to try, the phase breakdown as a bar, and the artifact paths."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from libreyolo_console.state import RunState
from libreyolo_console.widgets.fmt import off_gpu

# Each phase is drawn with its own character as well as its own colour, so the bar reads without colour.
PHASE_STYLE = {
    "data": ("█", "red"),
    "to_device": ("▓", "yellow"),
    "forward": ("▒", "green"),
    "loss": ("░", "cyan"),
    "backward": ("#", "blue"),
    "optimizer": ("=", "magenta"),
    "ema": ("-", "white"),
}
EMPTY = (
    "No profile in this run. Start one with profile=true (the form's profile switch), or run "
    "`libreyolo profile run ...`; the verdict, its evidence and the artifacts appear here."
)
WAITING = (
    "No profile yet: this run has profile=true, and the verdict appears here once its window is measured "
    "(profile_warmup steps, then profile_steps steps)."
)


def empty_hint(state: RunState) -> str:
    """What the panel says before any profile event: what would fill it, and which key does."""
    start = state.start
    if start is None:
        return EMPTY
    if (start.get("config") or {}).get("profile"):
        return WAITING
    device = off_gpu(start)
    where = f" It works on {device} too (phase times; GPU busy time needs CUDA)." if device else ""
    return (
        "No profile yet: this run was started with profile=false. Start a run with profile=true (the form's "
        "profile field, or `libreyolo train ... profile=true`), or run `libreyolo profile run ...`: the verdict, "
        f"the phase breakdown, the levers to try and a timeline appear here.{where}"
    )


def phase_bar(phases: dict[str, float], width: int) -> Text:
    """One stacked bar of the step's phases, proportional to their milliseconds."""
    total = sum(v for v in phases.values() if v > 0) or 1.0
    out = Text()
    used = 0
    items = [(k, v) for k, v in phases.items() if v > 0]
    for i, (name, ms) in enumerate(items):
        n = width - used if i == len(items) - 1 else round(ms / total * width)
        ch, style = PHASE_STYLE.get(name, ("·", "white"))
        out.append(ch * max(n, 0), style=style)
        used += n
    return out


def render_profile(p: dict[str, Any], width: int) -> Group:
    title = Text.assemble(("verdict: ", "bold"), (p["verdict"], "bold reverse"))
    util = "-" if p.get("utilization") is None else f"{p['utilization'] * 100:.0f}%"
    stats = Text(f"{p['step_ms']:.1f} ms/step   {p['img_s']:.1f} img/s   GPU busy {util}")
    why = Text.assemble(("why: ", "bold"), p["why"])
    levers = Text("levers:", style="bold")
    for i, lever in enumerate(p["levers"], 1):
        levers.append(f"\n  {i}. {lever}")
    phases = p["phases"]
    total = sum(phases.values()) or 1.0
    legend = Table.grid(padding=(0, 2))
    for _ in range(3):
        legend.add_column()
    for name, ms in phases.items():
        ch, style = PHASE_STYLE.get(name, ("·", "white"))
        legend.add_row(Text(ch * 2 + " " + name, style=style), f"{ms:.2f} ms", f"{ms / total * 100:.0f}%")
    arts = Text("artifacts:", style="bold")
    for name, path in p["artifacts"].items():
        arts.append(f"\n  {name}: {path}")
    timeline = p["artifacts"].get("timeline") or next((v for v in p["artifacts"].values() if v.endswith(".html")), None)
    parts: list[RenderableType] = [
        title,
        stats,
        why,
        levers,
        Text("phases per step:", style="bold"),
        phase_bar(phases, max(width - 1, 10)),
        legend,
        arts,
    ]
    if timeline:
        parts.append(Text(f"open the timeline in a browser: {timeline}", style="italic"))
    return Group(*parts)


class VerdictPanel(VerticalScroll):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: dict[str, Any] | None = None
        self._hint = EMPTY

    def compose(self) -> ComposeResult:
        yield Static(EMPTY, id="verdict-body")

    def show_state(self, state: RunState) -> None:
        hint = empty_hint(state)
        if state.profile is self._shown and (self._shown is not None or hint == self._hint):
            return
        self._shown, self._hint = state.profile, hint
        self._draw()

    def on_resize(self) -> None:
        self._draw()  # the phase bar spans the panel's width

    def _draw(self) -> None:
        body = self.query_one("#verdict-body", Static)
        width = self.scrollable_content_region.width or 78
        body.update(self._hint if self._shown is None else render_profile(self._shown, width))
