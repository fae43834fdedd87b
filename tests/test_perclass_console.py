"""Per-class metrics past `val` (issue 54): the trainer writes the per-class rows into the val event (schema 5) for
each best-so-far validation and the final one, and prints the best epoch's table at the run's end; the console's
Metrics panel shows that table for the best epoch and the compare view diffs it between two runs (by class name).
Event files written before schema 5 still load, and the panels say why there is no table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FAST, run_start_event
from console_driver import NoGpu, open_run_view, own_settings, until, write_events
from rich.console import Console

from libreyolo import events as ev
from libreyolo.render import RichRenderer
from libreyolo_console.app import ConsoleApp
from libreyolo_console.perclass import DiffRow, best_rows, diff, heading, table_cells
from libreyolo_console.screens.compare import CompareScreen
from libreyolo_console.state import RunState
from libreyolo_console.tail import EventTail
from libreyolo_console.widgets.perclass import PerClassDiff, PerClassPanel

SHAPES = ["circle", "square", "triangle"]
T0 = 1_000_000.0  # long past: no process of this machine is taken for these runs' trainers


def rows(maps: dict[str, float | None]) -> list[dict[str, Any]]:
    """Per-class rows as eval/perclass.py makes them (None: a class without ground truth)."""
    return [
        {
            "class": name,
            "images": 4 + k,
            "instances": 0 if m is None else 6 + k,
            **{key: None if m is None else round(m + d, 4) for key, d in _OFFSETS.items()},
        }
        for k, (name, m) in enumerate(maps.items())
    ]


_OFFSETS = {"precision": 0.2, "recall": 0.1, "map50": 0.15, "map": 0.0}


def val(epoch: int, m: float, per_class: list[dict[str, Any]] | None, t: float) -> ev.Val:
    return ev.Val(
        epoch=epoch,
        losses={},
        images=8,
        time_s=0.5,
        eval_s=0.1,
        held_s=0.5,
        metrics={"precision": m + 0.2, "recall": m + 0.1, "map50": m + 0.15, "map": m},
        per_class=per_class,
        t=t,
    )


def run_events(name: str, vals: list[tuple[float, list[dict[str, Any]] | None]], t0: float = T0) -> list[ev.Event]:
    """A finished 3-class detection run: one epoch per (mAP50-95, per-class rows) of vals."""
    n = len(vals)
    out: list[ev.Event] = [run_start_event(run_dir=name, nc=3, names=SHAPES, epochs=n, t=t0)]
    for epoch, (m, pc) in enumerate(vals):
        t = t0 + 10 * (epoch + 1)
        out.append(ev.EpochStart(epoch=epoch, epochs=n, steps=2, mosaic=False, t=t - 9))
        out.append(val(epoch, m, pc, t - 1))
        losses = {"box": 1.0, "cls": 2.0, "dfl": 1.5}
        out.append(ev.EpochEnd(epoch, losses, {"pg0": 0.01}, 10.0, 2.0, None, None, 0, t=t))
    best = max((e for e in out if isinstance(e, ev.Val)), key=lambda v: v.metrics["map"])  # (fitness grows with it)
    metrics = {**best.metrics, "fitness": 0.1 * best.metrics["map50"] + 0.9 * best.metrics["map"]}
    out.append(ev.RunEnd("finished", n, metrics["fitness"], None, None, 10.0 * n, metrics, t=t0 + 10 * n + 1))
    return out


# three epochs: the second is the best (its rows are what the panel shows), the third the final one
BEST = rows({"circle": 0.6, "square": 0.5, "triangle": 0.4})
THREE = [
    (0.2, rows({"circle": 0.3, "square": 0.2, "triangle": 0.1})),
    (0.5, BEST),
    (0.4, rows({"circle": 0.5, "square": 0.4, "triangle": 0.3})),
]


def state_of(events: list[ev.Event]) -> RunState:
    s = RunState()
    s.apply([e.to_dict() for e in events])
    return s


# --- the schema and the console's model ------------------------------------------------------------------
def test_val_with_per_class_validates_and_an_older_file_without_it_still_loads(tmp_path: Path) -> None:
    events = run_events("exp", THREE)
    path = write_events(tmp_path / "new", events)  # validate_event on every line: schema 5 with per_class
    assert [d.get("per_class") for d in ev.read_events(path) if d["type"] == "val"] == [pc for _, pc in THREE]
    # the same run as libreyolo wrote it before schema 5: no per_class field, v 4
    old = tmp_path / "old" / "events.jsonl"
    old.parent.mkdir()
    lines = [{k: v for k, v in e.to_dict().items() if k != "per_class"} | {"v": 4} for e in events]
    old.write_text("".join(json.dumps(d) + "\n" for d in lines))
    batch = EventTail(old).read()  # the console's reader accepts version 4 ...
    assert len(batch.events) == len(lines) and batch.bad_lines == 0
    s = RunState()
    s.apply(batch.events)
    assert s.bad_lines == 0 and s.best is not None and s.best.epoch == 1 and s.best.map == 0.5  # ... and folds it
    assert best_rows(s) == (s.best, None)
    assert heading(s).startswith("no per-class rows for epoch 2, the best")


def test_the_panel_takes_the_best_epochs_rows_not_the_last() -> None:
    s = state_of(run_events("exp", THREE))
    best, got = best_rows(s)
    assert best is not None and best.epoch == 1 and got == BEST
    assert heading(s) == "per class, epoch 2 (the best: best.pt)"
    assert table_cells(best, got) == [
        ("all", "8", "21", "0.7000", "0.6000", "0.6500", "0.5000"),
        ("circle", "4", "6", "0.8000", "0.7000", "0.7500", "0.6000"),
        ("square", "5", "7", "0.7000", "0.6000", "0.6500", "0.5000"),
        ("triangle", "6", "8", "0.6000", "0.5000", "0.5500", "0.4000"),
    ]


def test_a_class_without_ground_truth_shows_dashes() -> None:
    s = state_of(run_events("exp", [(0.3, rows({"circle": 0.3, "square": None, "triangle": 0.3}))]))
    best, got = best_rows(s)
    assert best is not None and got is not None
    assert table_cells(best, got)[2] == ("square", "5", "0", "-", "-", "-", "-")


def test_diff_matches_classes_by_name() -> None:
    a = rows({"circle": 0.6, "square": 0.5, "triangle": 0.4})
    b = rows({"square": 0.25, "circle": 0.7, "star": 0.1})  # another order, one class less, one more
    got = diff(a, b)
    assert [r.name for r in got] == ["circle", "square", "triangle", "star"]
    assert got[0] == DiffRow("circle", 0.6, 0.7) and got[0].delta == pytest.approx(0.1)
    assert got[1].cells() == ("square", "0.500", "0.250", "-0.250")
    assert got[2].cells() == ("triangle", "0.400", "-", "-")
    assert got[3].cells() == ("star", "-", "0.100", "-")


# --- the trainer ---------------------------------------------------------------------------------------------
def test_train_writes_the_rows_for_best_and_final_validations_and_prints_the_best(tiny_data, tmp_path, capsys) -> None:
    from libreyolo import LibreYOLO

    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(tiny_data), project=str(tmp_path), epochs=3, **FAST)
    vals = [d for d in ev.read_events(m.last_run / "events.jsonl") if d["type"] == "val"]
    assert len(vals) == 3
    fitness = [0.1 * v["metrics"]["map50"] + 0.9 * v["metrics"]["map"] for v in vals]
    for i, v in enumerate(vals):
        best_so_far = all(fitness[i] > f for f in fitness[:i])
        assert (v["per_class"] is not None) == (best_so_far or i == 2), (i, fitness)
    final = vals[-1]["per_class"]
    assert [r["class"] for r in final] == ["circle", "square", "triangle"]
    assert sum(r["instances"] for r in final) > 0 and all(r["images"] <= vals[-1]["images"] for r in final)
    # the table printed at the end is the best epoch's (the first of equal fitness, as best.pt)
    best = max(range(3), key=lambda i: (fitness[i], -i))
    out = capsys.readouterr().out
    assert f"per class, epoch {best + 1} (best.pt)" in out
    table = out[out.index("per class, epoch") :]
    for r in vals[best]["per_class"]:
        line = next(ln for ln in table.splitlines() if f" {r['class']} " in ln)
        assert f"{r['map']:.4f}" in line and f" {r['instances']} " in line


def test_the_renderer_prints_the_best_validation_not_the_last() -> None:
    console = Console(record=True, width=100)
    r = RichRenderer(plain=True, console=console)
    for e in run_events("exp", THREE):
        r(e)
    out = console.export_text()
    assert out.count("per class") == 1 and "per class, epoch 2 (best.pt)" in out
    assert "│ circle   │      4 │         6 │ 0.8000 │ 0.7000 │ 0.7500 │   0.6000 │" in out


# --- the console under Pilot ---------------------------------------------------------------------------------
def test_the_metrics_panel_shows_the_best_epochs_table(tmp_path, monkeypatch) -> None:
    own_settings(tmp_path, monkeypatch)
    run = tmp_path / "runs" / "exp"
    write_events(run, run_events(str(run), THREE))

    async def go() -> None:
        app = ConsoleApp(project=tmp_path / "runs", attach=run, gpu_sampler=NoGpu())
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await open_run_view(pilot)
            await pilot.press("2")
            panel = screen.query_one(PerClassPanel)
            await until(pilot, lambda: panel.shown, "the per-class table")
            assert panel.shown == table_cells(screen.state.best, BEST)
            assert "per class, epoch 2 (the best: best.pt)" in str(panel.query_one("#per-class-note").render())
            assert panel.region.width > 0 and panel.region.height > 3  # on screen, not squeezed away

    asyncio.run(go())


def _compare_runs(root: Path) -> None:
    """exp (newest, listed first), exp2 and exp3 (another class set), each finished."""
    write_events(
        root / "exp", run_events("exp", [(0.5, rows({"circle": 0.6, "square": 0.5, "triangle": 0.4}))], T0 + 3000)
    )
    write_events(
        root / "exp2", run_events("exp2", [(0.4, rows({"circle": 0.5, "square": 0.55, "triangle": 0.15}))], T0 + 2000)
    )
    write_events(root / "exp3", run_events("exp3", [(0.3, rows({"square": 0.3, "circle": 0.2, "star": 0.4}))], T0))


def test_the_compare_view_diffs_the_per_class_table_of_two_runs(tmp_path, monkeypatch) -> None:
    own_settings(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    _compare_runs(tmp_path / "runs")

    async def go() -> None:
        app = ConsoleApp(project="runs", gpu_sampler=NoGpu())
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: getattr(app.screen, "loaded", False), "the run list")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, CompareScreen), "the compare view")
            screen = app.screen
            await until(pilot, lambda: all(r.state.best is not None for r in screen.runs), "every run read")
            assert [r.name for r in screen.runs] == ["exp", "exp2", "exp3"]
            table = screen.query_one(PerClassDiff)
            assert not table.display and screen.query_one("#compare-plots").display
            await pilot.press("p")  # the difference in the plots' place: A the first run, B the second
            assert table.display and not screen.query_one("#compare-plots").display
            await until(pilot, lambda: table.shown, "the per-class difference")
            assert table.shown == [
                ("circle", "0.600", "0.500", "-0.100"),
                ("square", "0.500", "0.550", "+0.050"),
                ("triangle", "0.400", "0.150", "-0.250"),
            ]
            note = str(table.query_one("#per-class-diff-note").render())
            assert "A = exp (epoch 1), B = exp2 (epoch 1)" in note
            await pilot.press("down", "down")  # B follows the run table's cursor: exp3, other classes
            await until(pilot, lambda: table.shown and table.shown[0][2] == "0.200", "B = exp3")
            assert table.shown == [
                ("circle", "0.600", "0.200", "-0.400"),
                ("square", "0.500", "0.300", "-0.200"),
                ("triangle", "0.400", "-", "-"),
                ("star", "-", "0.400", "-"),
            ]
            await pilot.press("p")  # and back to the plots
            assert not table.display and screen.query_one("#compare-plots").display

    asyncio.run(go())
