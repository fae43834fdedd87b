"""The curves read without colour (a marker per series, in every colour mode) and their axes make sense
from the first point on."""

import asyncio
import re

import pytest
from textual.app import App, ComposeResult

from libreyolo_console.state import EpochRow, RunState
from libreyolo_console.widgets.plots import LossPlot, MetricsPlot, _Plot, y_limits


class PlotApp(App[None]):
    def __init__(self, plot: _Plot) -> None:
        super().__init__()
        self.plot = plot

    def compose(self) -> ComposeResult:
        yield self.plot


def _drawn(plot: _Plot, state: RunState) -> list[str]:
    """The plot as plain text lines, drawn in colour mode at 80x24."""

    async def run() -> str:
        app = PlotApp(plot)
        async with app.run_test(size=(80, 24)) as pilot:
            assert not app.no_color
            plot.show_state(state)
            await pilot.pause()
            return plot.plt.build()

    return re.sub(r"\x1b\[[0-9;]*m", "", asyncio.run(run())).splitlines()


def _legend(lines: list[str], names: tuple[str, ...]) -> dict[str, str]:
    """{series name: its legend marker}, read off the drawn plot."""
    out = {}
    for line in lines:
        m = re.search(r"[┤│] (\S\S) (\S+)\s", line)
        if m and m.group(2) in names:
            out[m.group(2)] = m.group(1)
    return out


def test_every_curve_has_its_own_marker_in_colour_mode_too():
    s = RunState()
    s.terms = ("box", "cls", "dfl")
    s.losses = [(0.1 * i, {"box": 1 / (i + 1), "cls": 2 / (i + 1), "dfl": 3 / (i + 1)}) for i in range(10)]
    legend = _legend(_drawn(LossPlot(), s), s.terms)
    assert set(legend) == {"box", "cls", "dfl"}
    assert len(set(legend.values())) == 3, legend  # not ▞▞ three times
    s.rows = {0: EpochRow(0, precision=0.3, recall=0.2, map50=0.25, map=0.16)}
    legend = _legend(_drawn(MetricsPlot(), s), ("P", "R", "mAP50", "mAP50-95"))
    assert len(set(legend.values())) == 4, legend


def test_one_validation_point_sits_on_a_0_to_1_axis():
    s = RunState()
    s.rows = {0: EpochRow(0, precision=0.3, recall=0.2, map50=0.25, map=0.16)}
    lines = _drawn(MetricsPlot(), s)
    ticks = [float(m.group(1)) for line in lines if (m := re.match(r"\s*(-?\d+\.\d+)┤", line))]
    assert max(ticks) == 1.0 and min(ticks) == 0.0, ticks
    axis = next(line for line in lines if re.match(r"\s*-?\d+\.\d+\s+-?\d", line))  # the x ticks
    assert "-" not in axis and "1.00" in axis  # epoch 1 between its neighbours, not on -1..1


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([2.0], (1.8, 2.2)),  # one point: a tenth of its value either side
        ([1.0, 3.0], (0.8, 3.2)),  # a tenth of the range either side
        ([0.05, 3.0], (0.0, 3.295)),  # never below 0 for losses that are not
        ([0.0], (0.0, 1.0)),
    ],
)
def test_loss_axes_are_the_values_padded(values, expected):
    assert y_limits(values, unit=False) == pytest.approx(expected)
    assert y_limits(values, unit=True) == (0.0, 1.0)
