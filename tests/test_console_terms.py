"""Family contract v2 in the console: the loss terms come from the event stream (run_start.loss_terms, or the
losses keys of a version-1 file), the run view says which CUDA-graph mode the run uses and why, and the
epoch table shows how long validation took."""

import asyncio
import time

import pytest
from conftest import run_start_event

from libreyolo import events as ev
from libreyolo_console.app import ConsoleApp
from libreyolo_console.screens.run import RunScreen
from libreyolo_console.state import RunState
from libreyolo_console.widgets import epochs
from libreyolo_console.widgets.epochs import EpochTable
from libreyolo_console.widgets.graph_log import GraphLog, mode_line, mode_short
from libreyolo_console.widgets.plots import LossPlot

TERMS = ("alpha", "beta")  # a family whose terms are nobody else's
AUTO_FULL = "cuda_graph=auto: the whole step in one graph (toy supports it, one CUDA process)"


def _d(e: ev.Event) -> dict:
    d = e.to_dict()
    ev.validate_event(d)
    return d


# what docs/events.md says a version-1 file lacked
_V2_ONLY = {"run_start": ("loss_terms", "cuda_graph_mode", "cuda_graph_reason"), "val": ("eval_s",)}


def _v1(d: dict) -> dict:
    """A valid v2 event as a version-1 file (an older run) has it."""
    return {k: v for k, v in d.items() if k not in _V2_ONLY.get(d["type"], ())} | {"v": 1}


def _start(terms=TERMS, cuda_graph="auto", mode="full", reason=AUTO_FULL, epochs=2, t=100.0):
    return _d(
        run_start_event(
            run_dir="runs/exp",
            model="Toy1n",
            family="toy",
            epochs=epochs,
            device="cuda:0",
            amp=True,
            amp_dtype="bfloat16",
            cuda_graph=cuda_graph,
            cuda_graph_mode=mode,
            cuda_graph_reason=reason,
            loss_terms=list(terms),
            optimizer="AdamW(lr=0.001, momentum=0.9)",
            steps_per_epoch=4,
            train_images=32,
            params=1000,
            t=t,
        )
    )


def _epoch(epoch, losses, t, val_s=0.18, eval_s=0.4):
    """One epoch's events: two step events (the first before any read-back landed), val, epoch_end."""
    half = {k: 2 * v for k, v in losses.items()}
    return [
        _d(ev.EpochStart(epoch=epoch, epochs=2, steps=4, mosaic=True, t=t)),
        *[
            _d(
                ev.Step(
                    epoch=epoch,
                    step=s,
                    steps=4,
                    losses=lo,
                    lr=0.01,
                    img_s=120.0,
                    data_frac=0.1,
                    step_ms=20.0,
                    gpu_mem_gb=1.0,
                    eta_s=9.0,
                    t=t + s,
                )
            )
            for s, lo in ((1, {}), (2, half), (4, losses))
        ],
        _d(
            ev.Val(
                epoch=epoch,
                precision=0.5,
                recall=0.4,
                map50=0.3,
                map=0.2,
                losses=losses,
                images=8,
                time_s=val_s,
                eval_s=eval_s,
                t=t + 5,
            )
        ),
        _d(
            ev.EpochEnd(
                epoch=epoch,
                losses=losses,
                lr={"pg0": 0.01},
                time_s=6.0,
                img_s=120.0,
                fitness=0.21,
                best_fitness=0.21,
                skipped_images=0,
                t=t + 6,
            )
        ),
    ]


def _v2_run() -> list[dict]:
    return [_start(), *_epoch(0, {"alpha": 0.5, "beta": 1.5}, 101.0), *_epoch(1, {"alpha": 0.25, "beta": 1.0}, 110.0)]


def test_a_family_s_own_terms_name_the_rows_the_curves_and_the_columns():
    s = RunState()
    s.apply(_v2_run())
    assert s.terms == TERMS and s.bad_lines == 0
    assert s.rows[0].losses == {"alpha": 0.5, "beta": 1.5} and s.rows[1].losses == {"alpha": 0.25, "beta": 1.0}
    assert (s.rows[1].val_s, s.rows[1].eval_s) == (0.18, 0.4)
    curves = LossPlot.curves(LossPlot().data(s))
    assert [c[0] for c in curves] == list(TERMS)
    assert curves[0][1:] == ([0.5, 1.0, 1.5, 2.0], [1.0, 0.5, 0.5, 0.25])  # (the empty read-backs plot nothing)
    assert epochs.columns(s.terms) == ("epoch", "alpha", "beta", "P", "R", "mAP50", "mAP50-95", "time", "val", "img/s")
    assert epochs.cells(s.rows[1], s.terms) == (
        "2",
        "0.250",
        "1.000",
        "0.500",
        "0.400",
        "0.300",
        "0.200",
        "0:06",
        "0.18s+0.40s",
        "120",
    )


def test_a_version_1_file_takes_its_terms_from_the_losses_keys():
    events = [_v1(e) for e in _v2_run()]
    events[0]["cuda_graph"] = "true"
    s = RunState()
    s.apply(events[:3])  # run_start, epoch_start, a step with no losses yet: no terms known
    assert s.terms == ()
    s.apply(events[3:])
    assert s.terms == TERMS and s.bad_lines == 0  # the keys of the first non-empty losses dict, in order
    assert s.rows[0].losses == {"alpha": 0.5, "beta": 1.5} and len(s.losses) == 4
    assert (s.rows[0].val_s, s.rows[0].eval_s) == (0.18, None) and epochs.val_time(s.rows[0]) == "0.18s"
    assert mode_short(s) == "cuda_graph true" and "version 1" in mode_line(s)
    only_epoch_end = RunState()  # no step ever had losses: epoch_end's dict names them
    only_epoch_end.apply(
        [
            events[0],
            _v1(
                _d(
                    ev.EpochEnd(
                        epoch=0,
                        losses={"gamma": 1.0, "delta": 2.0},
                        lr={},
                        time_s=1.0,
                        img_s=1.0,
                        fitness=None,
                        best_fitness=None,
                        skipped_images=0,
                    )
                )
            ),
        ]
    )
    assert only_epoch_end.terms == ("gamma", "delta")
    resumed = RunState()  # an old run resumed by a newer trainer: its run_start's terms are the run's
    resumed.apply([events[0], events[3], _start(terms=("beta", "alpha", "gamma"), t=200.0)])
    assert resumed.terms == ("beta", "alpha", "gamma")


@pytest.mark.parametrize(
    "start, short, line",
    [
        (
            dict(),
            "cuda_graph full (auto)",
            "cuda_graph full (auto): the whole step in one graph (toy supports it, one CUDA process)",
        ),
        (
            dict(cuda_graph="true", mode="true", reason="cuda_graph=true: the network in a graph"),
            "cuda_graph true",
            "cuda_graph true: the network in a graph",
        ),
        (
            dict(mode="false", reason="cuda_graph=auto: CUDA graphs need a CUDA device; training eager on cpu"),
            "",
            "cuda_graph false (auto): CUDA graphs need a CUDA device; training eager on cpu",
        ),
        (
            dict(
                cuda_graph="full",
                mode="false",
                reason="cuda_graph=full: the toy family does not support whole-step capture; training eager",
            ),
            "cuda_graph false (full)",
            "cuda_graph false (full): the toy family does not support whole-step capture; training eager",
        ),
    ],
)
def test_the_mode_line_says_which_cuda_graph_mode_the_run_uses_and_why(start, short, line):
    s = RunState()
    s.apply([_start(**start)])
    assert (mode_short(s), mode_line(s)) == (short, line)


def test_a_fallback_after_run_start_turns_the_mode_eager():
    s = RunState()
    s.apply(
        [
            _start(),
            _d(ev.Graph(action="capture", mode="full", reason="captured", shape=[8, 3, 64, 64], t=103.0)),
            _d(
                ev.Graph(
                    action="fallback",
                    mode="full",
                    reason="replay failed (RuntimeError: x); training eager from here on",
                    t=104.5,
                )
            ),
        ]
    )
    assert mode_short(s) == "cuda_graph false (fallback)"
    assert (
        mode_line(s).splitlines()[1]
        == "then eager from +4.5s: replay failed (RuntimeError: x); training eager from here on"
    )


def test_a_step_down_after_run_start_turns_the_mode_to_the_network_graph():
    s = RunState()
    s.apply(
        [
            _start(),
            _d(
                ev.Graph(
                    action="step_down",
                    mode="network",
                    reason="capture failed (RuntimeError: x); the network's forward and backward in a graph from "
                    "here on (cuda_graph=true)",
                    t=104.5,
                )
            ),
        ]
    )
    assert mode_short(s) == "cuda_graph true (step-down)"
    assert (
        mode_line(s)
        .splitlines()[1]
        .startswith("then the network graph (cuda_graph true) from +4.5s: capture failed (RuntimeError: x)")
    )


def test_the_run_view_shows_the_family_s_columns_the_mode_line_and_the_validation_time(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBREYOLO_CONSOLE_CONFIG", str(tmp_path / "console.yaml"))
    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    w = ev.EventWriter(run_dir / "events.jsonl")
    for e in _v2_run():
        w.write(ev.EVENT_TYPES[e["type"]](**{k: v for k, v in e.items() if k not in ("type", "v")}))
    w.write(
        ev.Graph(action="capture", mode="full", reason="captured the whole micro step", shape=[8, 3, 64, 64], t=102.0)
    )
    w.write(
        ev.Graph(
            action="recapture",
            mode="full",
            reason="re-captured: L1 loss on at epoch 2; captured the whole micro step",
            shape=[8, 3, 64, 64],
            t=112.0,
        )
    )
    w.write(
        ev.RunEnd(
            status="finished", epochs_done=2, best_fitness=0.21, best=None, last=None, time_s=20.0, metrics={}, t=117.0
        )
    )
    w.close()

    async def go():
        app = ConsoleApp(project=tmp_path / "runs", attach=run_dir, gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            deadline = time.monotonic() + 30
            while (
                not (isinstance(app.screen, RunScreen) and app.screen.status == "finished")
                and time.monotonic() < deadline
            ):
                await pilot.pause(0.05)
            screen = app.screen
            await pilot.press("2")
            await pilot.pause(0.6)  # two redraw ticks
            table = screen.query_one("#epoch-table", EpochTable)
            assert [str(c.label) for c in table.columns.values()] == list(epochs.columns(TERMS))
            assert table.get_row_at(1)[1:3] == ["0.250", "1.000"] and table.get_row_at(1)[-2] == "0.18s+0.40s"
            assert "cuda_graph full (auto)" in str(screen.query_one("#run-status").render())
            await pilot.press("5")
            await pilot.pause(0.3)
            log = screen.query_one(GraphLog)
            assert str(log.query_one("#graph-mode").render()) == mode_line(screen.state)
            assert mode_line(screen.state).startswith("cuda_graph full (auto): the whole step in one graph")

    asyncio.run(go())


def test_the_plot_and_the_table_take_any_number_of_terms_and_rebuild_when_they_change(monkeypatch):
    from textual.app import App

    monkeypatch.setenv("NO_COLOR", "1")  # curves then differ by marker: they cycle past six terms

    class Panels(App):
        def compose(self):
            yield LossPlot()
            yield EpochTable()

    many = tuple(f"t{i}" for i in range(7))

    async def go():
        async with Panels().run_test(size=(100, 30)) as pilot:
            plot, table = pilot.app.query_one(LossPlot), pilot.app.query_one(EpochTable)
            drawn = []
            draw = plot.draw
            plot.draw = lambda data: (drawn.append([c[0] for c in plot.curves(data) if c[1]]), draw(data))
            two, seven = RunState(), RunState()
            two.apply(_v2_run())
            seven.apply([_start(terms=many), *_epoch(0, {t: i / 10 for i, t in enumerate(many)}, 101.0)])
            for state in (two, seven):  # seven: a re-attach that found a run of another family
                plot.show_state(state)
                table.show_state(state)
                await pilot.pause()
                assert [str(c.label) for c in table.columns.values()] == list(epochs.columns(state.terms))
                assert table.row_count == len(state.rows) and drawn[-1] == list(state.terms)
            assert [m for m, _ in plot.series(7)] == ["+", "x", "o", "*", "#", "%", "+"]

    asyncio.run(go())
