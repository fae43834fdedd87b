"""Live curves drawn in the terminal (plotext): training losses per step event, the task's validation metrics (P/R/mAP,
top-1/top-5) per epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from textual.app import App
from textual.color import Color
from textual_plotext import PlotextPlot

from libreyolo_console.state import RunState

# Each curve has its own marker character as well as its own colour, so the curves and their legend read
# without colour too (NO_COLOR, colour-blind eyes, a 16-colour terminal).
MARKERS = ("+", "x", "o", "*", "#", "%")
# Curve colours come from the app's theme, set explicitly: plotext's own colour sequence depends on global
# state (which themes were registered first), which made the same screen render differently.
_THEME_COLORS = ("primary", "warning", "success", "error", "accent", "secondary")


def series_styles(app: App[object], n: int) -> list[tuple[str, tuple[int, int, int]]]:
    """(marker, colour) for each of n curves in turn: the marker never depends on the colour mode, and past six
    curves the colours are offset so that every pair still differs."""
    variables = app.theme_variables
    colors = [Color.parse(variables.get(name, "white")).rgb for name in _THEME_COLORS]
    return [(MARKERS[i % len(MARKERS)], colors[(i + i // len(colors)) % len(colors)]) for i in range(n)]


def y_limits(values: list[float], unit: bool) -> tuple[float, float]:
    """The y axis: 0..1 for metrics (P, R, mAP live there); otherwise the values' range padded by a tenth on each
    side (a tenth of the value when they are all equal, as one point is), never below 0 unless a value is. plotext
    alone puts a single point in the middle of -1..1."""
    if unit:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    bottom = lo - pad if lo < 0 else max(lo - pad, 0.0)
    return bottom, hi + pad


def x_limits(xs: Sequence[float]) -> tuple[float, float] | None:
    """One epoch: an axis from the epoch before to the one after (plotext would centre it on -1..1)."""
    if not xs or max(xs) > min(xs):
        return None
    return max(min(xs) - 1, 0.0), max(xs) + 1


# what a plot draws, compared between batches of events to skip redraws that would change nothing
# LossPlot: (the loss terms, (fractional epoch, {term: loss}) per step event)
LossData = tuple[tuple[str, ...], tuple[tuple[float, dict[str, float]], ...]]
# MetricsPlot: (the metrics' headings, (epoch number, each metric's value) per validated epoch)
MetricsData = tuple[tuple[str, ...], tuple[tuple[int, tuple[float | None, ...]], ...]]
PlotData = TypeVar("PlotData")


class _Plot(PlotextPlot, Generic[PlotData]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._state: RunState | None = None
        self._drawn: PlotData | None = None

    def on_mount(self) -> None:
        # (Textual also runs PlotextPlot.on_mount: handlers of every class in the MRO are called)
        self.app.theme_changed_signal.subscribe(self, self._recolor)

    def _recolor(self, _theme: object) -> None:
        if self._state is not None:
            self.show_state(self._state, force=True)

    def show_state(self, state: RunState, force: bool = False) -> None:
        """Redrawn only when the curves' data changed (or the theme did): the run view calls this for every
        batch of events, and the validation curves change once an epoch."""
        self._state = state
        data = self.data(state)
        if data == self._drawn and not force:
            return
        self._drawn = data
        self.plt.clear_data()
        self.draw(data)
        self.refresh()

    def data(self, state: RunState) -> PlotData:
        raise NotImplementedError

    def draw(self, data: PlotData) -> None:
        raise NotImplementedError

    def series(self, n: int) -> list[tuple[str, tuple[int, int, int]]]:
        return series_styles(self.app, n)


class LossPlot(_Plot[LossData]):
    """Each of the family's loss terms (means since the epoch began) against training progress in epochs."""

    def data(self, state: RunState) -> LossData:
        return state.terms, tuple(state.losses)

    @staticmethod
    def curves(data: LossData) -> list[tuple[str, list[float], list[float]]]:
        """(term, xs, ys) per loss term, in the family's order; a point without that term is left out."""
        terms, pts = data
        return [(t, [x for x, lo in pts if t in lo], [lo[t] for _, lo in pts if t in lo]) for t in terms]

    def draw(self, data: LossData) -> None:
        plt = self.plt
        plt.title("training loss")
        plt.xlabel("epoch")
        curves = self.curves(data)
        for (name, xs, ys), (marker, color) in zip(
            curves, self.series(len(curves)), strict=True
        ):  # a term keeps its colour
            if xs:
                plt.plot(xs, ys, label=name, marker=marker, color=color)
        ys = [y for _, _, vs in curves for y in vs]
        if ys:
            plt.ylim(*y_limits(ys, unit=False))
        plt.xlim(*(x_limits([x for _, vs, _ in curves for x in vs]) or (None, None)))  # (None: plotext's own)


class MetricsPlot(_Plot[MetricsData]):
    """The task's validation metrics per epoch (detection: precision, recall, mAP50, mAP50-95)."""

    def data(self, state: RunState) -> MetricsData:
        rows = tuple(
            (r.epoch + 1, tuple(r.metrics.get(m) for m in state.metrics))
            for _, r in sorted(state.rows.items())
            if r.metrics
        )
        return state.labels, rows

    def draw(self, data: MetricsData) -> None:
        plt = self.plt
        plt.title("validation")
        plt.xlabel("epoch")
        labels, rows = data
        if rows:
            xs = [r[0] for r in rows]
            for i, (name, (marker, color)) in enumerate(zip(labels, self.series(len(labels)), strict=True)):
                plt.plot(xs, [r[1][i] for r in rows], label=name, marker=marker, color=color)
            plt.ylim(*y_limits([], unit=True))
            plt.xlim(*(x_limits(xs) or (None, None)))
