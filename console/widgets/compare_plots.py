"""The compare view's curves: one series per run, each with its own marker character AND colour (the same
pair in both plots and in the table's run column), so they read apart with NO_COLOR or colour-blind."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from libreyolo_console.compare import Curve
from libreyolo_console.widgets.plots import series_styles

# (run's index among the compared runs, run name, its curve)
Series = tuple[int, str, Curve]


class ComparePlot(PlotextPlot):
    """Curves of several runs; redrawn only when the data (or the theme) changed."""

    def __init__(self, xlabel: str = "epoch", *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.xlabel = xlabel
        self.drawn: tuple[str, tuple[Series, ...], int] | None = None  # title, series, runs compared

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._recolor)

    def _recolor(self, _theme: object) -> None:
        if self.drawn is not None:
            title, series, n = self.drawn
            self.drawn = None
            self.show_series(title, list(series), n)

    @property
    def names(self) -> list[str]:
        """The runs drawn, one series each (runs without a point yet are left out)."""
        return [name for _, name, _ in self.drawn[1]] if self.drawn else []

    def show_series(self, title: str, series: list[Series], n_runs: int) -> None:
        drawn = (title, tuple((i, name, (list(xs), list(ys))) for i, name, (xs, ys) in series if xs), n_runs)
        if drawn == self.drawn:
            return
        self.drawn = drawn
        plt = self.plt
        plt.clear_data()
        plt.title(title)
        plt.xlabel(self.xlabel)
        styles = series_styles(self.app, n_runs)
        for i, name, (xs, ys) in drawn[1]:
            marker, color = styles[i]
            plt.plot(xs, ys, label=name, marker=marker, color=color)
        self.refresh()
