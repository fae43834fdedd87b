"""Live curves drawn in the terminal (plotext): training losses per step event, P/R/mAP per epoch."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from console.state import RunState

# With NO_COLOR every curve is the same colour, so each gets its own marker character instead.
_PLAIN_MARKERS = ("+", "x", "o", "*")


class _Plot(PlotextPlot):
    def _markers(self) -> tuple[str, ...]:
        return _PLAIN_MARKERS if self.app.no_color else ("hd",) * len(_PLAIN_MARKERS)


class LossPlot(_Plot):
    """box, cls and dfl loss (means since the epoch began) against training progress in epochs."""

    def show_state(self, state: RunState) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title("training loss")
        plt.xlabel("epoch")
        pts = state.losses
        if pts:
            xs = [p[0] for p in pts]
            for i, (name, marker) in enumerate(zip(("box", "cls", "dfl"), self._markers())):
                plt.plot(xs, [p[i + 1] for p in pts], label=name, marker=marker)
        self.refresh()


class MetricsPlot(_Plot):
    """Validation precision, recall, mAP50 and mAP50-95 per epoch."""

    def show_state(self, state: RunState) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title("validation")
        plt.xlabel("epoch")
        rows = [r for _, r in sorted(state.rows.items()) if r.map is not None]
        if rows:
            xs = [r.epoch + 1 for r in rows]
            series = (("P", [r.precision for r in rows]), ("R", [r.recall for r in rows]),
                      ("mAP50", [r.map50 for r in rows]), ("mAP50-95", [r.map for r in rows]))
            for (name, ys), marker in zip(series, self._markers()):
                plt.plot(xs, ys, label=name, marker=marker)
        self.refresh()
