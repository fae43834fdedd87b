"""The compare view (issue 16, point 8): runs marked in the run list (or all of them) in one table and two
overlaid plots. The model is tested without Textual; the screen with Pilot on made-up run folders (three
runs, one crashed, one of another family and resumed), plus a live run whose file grows while it is shown.

Run folders are written as the trainer writes them (events.jsonl through libreyolo.events, validated), at
fixed times long past, so no process of this machine can be taken for their trainer."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import run_start_event
from console_driver import NoGpu, own_settings, until

from libreyolo import events as ev
from libreyolo.config import TrainConfig
from libreyolo.families import get_family
from libreyolo_console.app import ConsoleApp
from libreyolo_console.compare import (
    TOTAL,
    CompareRun,
    differing_keys,
    follow_all,
    loss_choices,
    loss_note,
)
from libreyolo_console.screens.compare import CompareScreen
from libreyolo_console.screens.runs import RunsScreen
from libreyolo_console.supervisor import ProcessRecord, write_record
from libreyolo_console.tail import EventTail
from libreyolo_console.widgets.compare_plots import ComparePlot
from libreyolo_console.widgets.compare_table import CompareTable
from libreyolo_console.widgets.run_list import RunList

YOLO9 = get_family("yolo9").loss_terms
YOLOX = get_family("yolox").loss_terms
T0 = 1_000_000.0  # 1970: no process here started before it, so no pid is taken for these runs' trainers
SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


# --- writing run folders ----------------------------------------------------------------------------------
def _config(**changes: Any) -> dict[str, Any]:
    return {**TrainConfig().to_dict(), "device": "cuda:0", **changes}


def _run_start(config: dict[str, Any], terms: tuple[str, ...], epochs: int, start_epoch: int, t: float) -> ev.RunStart:
    return run_start_event(
        run_dir="runs/train/x",
        model=config["model"],
        family="yolox" if terms == YOLOX else "yolo9",
        nc=3,
        names=["circle", "square", "triangle"],
        data="shapes",
        epochs=epochs,
        start_epoch=start_epoch,
        batch=config["batch"],
        batch_per_rank=config["batch"],
        accumulate=1,
        imgsz=config["imgsz"],
        device="cuda:0",
        amp=True,
        amp_dtype="bfloat16",
        cuda_graph_mode="full",
        cuda_graph_reason="cuda_graph=auto: the whole step in one graph",
        loss_terms=list(terms),
        workers=8,
        optimizer="AdamW(lr=0.001, momentum=0.9)",
        steps_per_epoch=10,
        train_images=640,
        val_images=64,
        params=1000,
        pid=4_000_000,  # above any pid_max: never a process of this machine
        resumed=start_epoch > 0,
        config={**config, "resume": start_epoch > 0},
        t=t,
    )


def _epoch_events(epoch: int, epochs: int, terms: tuple[str, ...], t: float, quality: float, img_s: float):
    """One epoch, 10 s long: epoch_start, two step events, val, epoch_end."""
    out: list[ev.Event] = [ev.EpochStart(epoch=epoch, epochs=epochs, steps=10, mosaic=True, t=t)]
    for step in (5, 10):
        f = 1.0 / (1 + epoch + step / 10)
        out.append(
            ev.Step(
                epoch=epoch,
                step=step,
                steps=10,
                losses={k: f * (j + 1) for j, k in enumerate(terms)},
                lr=0.001,
                img_s=img_s,
                data_frac=0.05,
                step_ms=40.0,
                gpu_mem_gb=8.0,
                eta_s=100.0,
                t=t + step * 0.8,
            )
        )
    m = quality * (epoch + 1) / 10
    out.append(
        ev.Val(
            epoch=epoch,
            precision=0.5,
            recall=0.4,
            map50=m + 0.1,
            map=m,
            losses={},
            images=64,
            time_s=1.0,
            eval_s=0.5,
            t=t + 9,
        )
    )
    out.append(
        ev.EpochEnd(
            epoch=epoch,
            losses={k: 0.5 * (j + 1) for j, k in enumerate(terms)},
            lr={"pg0": 0.001},
            time_s=10.0,
            img_s=img_s,
            fitness=m,
            best_fitness=m,
            skipped_images=0,
            t=t + 10,
        )
    )
    return out


def write_run(
    run_dir: Path,
    config: dict[str, Any],
    *,
    epochs: int,
    parts: list[tuple[int, int, str | None]],
    t0: float = T0,
    terms: tuple[str, ...] = YOLO9,
    quality: float = 1.0,
    img_s: float = 1600.0,
    gap: float = 500.0,
) -> None:
    """A run trained by one process per part (first epoch, end epoch, run_end status or None for a crash),
    each part `gap` seconds after the previous one ended."""
    run_dir.mkdir(parents=True, exist_ok=True)
    w = ev.EventWriter(run_dir / "events.jsonl")
    t = t0
    for first, end, status in parts:
        started = t
        w.write(_run_start(config, terms, epochs, first, t))
        for epoch in range(first, end):
            for e in _epoch_events(epoch, epochs, terms, t, quality, img_s):
                w.write(e)
            t += 10
        if status is not None:
            w.write(
                ev.RunEnd(
                    status=status,
                    epochs_done=end,
                    best_fitness=None,
                    best=None,
                    last=None,
                    time_s=t - started,
                    metrics={},
                    t=t,
                )
            )
        t += gap
    w.close()
    for d in ev.read_events(run_dir / "events.jsonl"):
        ev.validate_event(d)  # what the trainer could write today


def crash(run_dir: Path) -> None:
    """Its supervisor record names pid 1, which exists but started at another time: the run's process is gone."""
    write_record(run_dir, ProcessRecord(pid=1, pgid=1, create_time=12.0, cmdline=["python"], started=T0))


def three_runs(root: Path) -> dict[str, Path]:
    """exp: finished (4 epochs). exp2: crashed in its 3rd epoch, a larger batch. exp3: YOLOX with another lr0,
    interrupted after 2 epochs and resumed to the end (two processes)."""
    dirs = {name: root / name for name in ("exp", "exp2", "exp3")}
    write_run(dirs["exp"], _config(), epochs=4, parts=[(0, 4, "finished")], t0=T0 + 3000)
    write_run(dirs["exp2"], _config(batch=32), epochs=4, parts=[(0, 2, None)], t0=T0 + 2000, quality=0.5, img_s=900)
    crash(dirs["exp2"])
    x = _config(model="LibreYOLOXs", lr0=0.02)
    write_run(dirs["exp3"], x, epochs=3, parts=[(0, 2, "interrupted"), (2, 3, "finished")], t0=T0, terms=YOLOX)
    return dirs


def _model(run_dir: Path, name: str | None = None) -> CompareRun:
    run = CompareRun(run_dir, name or run_dir.name)
    tail = EventTail(run_dir / "events.jsonl")
    batch = tail.read()
    run.apply(batch.events, batch.reset)
    run.check_status()
    return run


# --- the model --------------------------------------------------------------------------------------------
def test_model_of_three_runs(tmp_path):
    dirs = three_runs(tmp_path)
    runs = [_model(d) for d in dirs.values()]
    exp, exp2, exp3 = runs
    assert [r.status for r in runs] == ["finished", "crashed", "finished"]
    assert [r.epoch_text for r in runs] == ["4/4", "2/4", "3/3"]
    assert (exp.best_map, exp2.best_map, exp3.best_map) == pytest.approx((0.4, 0.1, 0.3))
    assert exp2.img_s == 900.0 and exp.gpu == "cuda:0"
    # keys that differ; the run's own name (and exp3's resume flag) is bookkeeping, not a difference
    assert differing_keys(runs) == ["model", "batch", "lr0"]
    assert differing_keys(runs[:2]) == ["batch"]
    assert differing_keys(runs[:1]) == []


def test_wall_time_sums_the_processes_of_a_resumed_run(tmp_path):
    # interrupted after 20 s, resumed 500 s later for 10 s more: 30 s of training, not the 530 s between
    write_run(tmp_path / "a", _config(), epochs=3, parts=[(0, 2, "interrupted"), (2, 3, "finished")])
    assert _model(tmp_path / "a").wall_s == pytest.approx(30.0)
    # a crashed process counts until its last event (epoch_end at +20 s), then the resume's 10 s
    write_run(tmp_path / "b", _config(), epochs=3, parts=[(0, 2, None), (2, 3, "finished")])
    assert _model(tmp_path / "b").wall_s == pytest.approx(30.0)
    # a run still going (or crashed): from run_start to its newest event
    write_run(tmp_path / "c", _config(), epochs=3, parts=[(0, 1, None)])
    assert _model(tmp_path / "c").wall_s == pytest.approx(10.0)
    assert CompareRun(tmp_path / "none", "none").wall_s is None


def test_args_come_from_args_yaml_when_run_start_has_no_config(tmp_path):
    write_run(tmp_path / "a", _config(), epochs=1, parts=[(0, 1, "finished")])
    write_run(tmp_path / "b", _config(), epochs=1, parts=[(0, 1, "finished")])
    runs = [_model(tmp_path / "a"), _model(tmp_path / "b")]
    for r in runs:
        r.first_start = {**(r.first_start or {}), "config": {}}  # as a run_start written without its config
    (tmp_path / "a" / "args.yaml").write_text(yaml.safe_dump({"lr0": 0.01, "cos_lr": False}))
    (tmp_path / "b" / "args.yaml").write_text(yaml.safe_dump({"lr0": 0.01, "cos_lr": True}))
    runs = [CompareRun(r.run_dir, r.name, first_start=r.first_start) for r in runs]
    assert differing_keys(runs) == ["cos_lr"]


def test_losses_of_different_families_overlay_the_total_or_a_shared_term(tmp_path):
    write_run(tmp_path / "v9", _config(), epochs=1, parts=[(0, 1, "finished")])
    write_run(tmp_path / "x", _config(model="LibreYOLOXs"), epochs=1, parts=[(0, 1, "finished")], terms=YOLOX)
    v9, x = _model(tmp_path / "v9"), _model(tmp_path / "x")
    assert loss_choices([v9, x]) == [TOTAL, "cls"]  # the one term both families have, by name
    assert loss_choices([v9]) == [TOTAL, *YOLO9]
    # the step at 5/10 of epoch 0: f = 1/1.5, terms f*1, f*2, f*3(, f*4)
    xs, ys = v9.loss_curve(TOTAL)
    assert xs == [0.5, 1.0] and ys[0] == pytest.approx(6 / 1.5)
    assert x.loss_curve(TOTAL)[1][0] == pytest.approx(10 / 1.5)
    assert x.loss_curve("cls")[1][0] == pytest.approx((YOLOX.index("cls") + 1) / 1.5)
    note = loss_note([v9, x], TOTAL)
    assert "+".join(YOLO9) in note and "+".join(YOLOX) in note and "l: cls" in note
    assert loss_note([v9, x], "cls").startswith("loss: cls (a term every run has)")


def test_follow_all_reads_only_what_was_appended(tmp_path):
    a, b = tmp_path / "a" / "events.jsonl", tmp_path / "b" / "events.jsonl"
    write_run(a.parent, _config(), epochs=2, parts=[(0, 1, None)])
    got: list[tuple[int, int]] = []
    stop = threading.Event()
    tails = [EventTail(a), EventTail(b)]
    worker = threading.Thread(
        target=follow_all, args=(tails, lambda i, bt: got.append((i, len(bt.events))), stop, 0.02)
    )
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [(0, 6), (1, 0)]  # b has no file yet: delivered once, empty, so the view knows
        w = ev.EventWriter(a)
        w.write(ev.Heartbeat(epoch=1, step=3, pid=4_000_000, t=T0 + 99))
        w.close()
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [(0, 6), (1, 0), (0, 1)]
    finally:
        stop.set()
        worker.join()


# --- the screen -------------------------------------------------------------------------------------------
@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own_settings(tmp_path, monkeypatch)
    monkeypatch.delenv("NO_COLOR", raising=False)
    three_runs(tmp_path / "runs" / "train")
    return "runs/train"


async def _list_ready(pilot) -> None:
    await until(pilot, lambda: getattr(pilot.app.screen, "loaded", False), "the run list")


async def _compare_ready(pilot) -> CompareScreen:
    await until(pilot, lambda: isinstance(pilot.app.screen, CompareScreen), "the compare view")
    screen = pilot.app.screen
    await until(pilot, lambda: all(r.status != "?" for r in screen.runs), "every run read")
    # a DataTable sizes its columns to new rows when it is next idle: a busy machine can take the picture before.
    # And a run's events can arrive in more than one batch after its status is known: each batch that changes a row
    # refills the table, whose columns shrink to their labels until the next idle (a CI picture once showed that).
    # So: the columns fit, and no row changed over more than two redraw ticks (0.5 s each).
    table = screen.query_one(CompareTable)
    deadline = time.monotonic() + 20.0
    while True:
        await until(pilot, lambda: _columns_fit(table), "the table's columns sized to its rows")
        rows = list(table.rows_shown)
        await pilot.pause(1.2)
        if table.rows_shown == rows and _columns_fit(table):
            return screen
        assert time.monotonic() < deadline, "the compare table kept changing for 20 s"


def _columns_fit(table: CompareTable) -> bool:
    return bool(table.rows_shown) and all(
        col.content_width >= max(len(row[j]) for row in table.rows_shown)
        for j, col in enumerate(table.columns.values())
    )


def _rows(screen: CompareScreen) -> list[tuple[str, ...]]:
    return screen.query_one(CompareTable).rows_shown


def test_compare_all_runs_when_none_is_marked(project):
    async def go() -> None:
        app = ConsoleApp(project=project, gpu_sampler=NoGpu())
        async with app.run_test(size=(120, 40)) as pilot:
            await _list_ready(pilot)
            await pilot.press("c")
            screen = await _compare_ready(pilot)
            cols = ("run", "state", "epoch", "mAP50-95", "img/s", "GPU", "wall", "model", "batch", "lr0")
            assert tuple(str(c.label) for c in screen.query_one(CompareTable).columns.values()) == cols
            assert _rows(screen) == [
                ("exp", "finished", "4/4", "0.400", "1600", "cuda:0", "0:40", "LibreYOLO9t", "16", "0.01"),
                ("exp2", "crashed", "2/4", "0.100", "900", "cuda:0", "0:20", "LibreYOLO9t", "32", "0.01"),
                ("exp3", "finished", "3/3", "0.300", "1600", "cuda:0", "0:30", "LibreYOLOXs", "16", "0.02"),
            ]
            loss, maps = screen.query_one("#compare-loss", ComparePlot), screen.query_one("#compare-map", ComparePlot)
            assert loss.names == ["exp", "exp2", "exp3"]  # one series per run
            assert maps.names == ["exp", "exp2", "exp3"]
            assert loss.drawn is not None and loss.drawn[0] == "training loss (total)"
            series = _plot_series(loss)
            assert [label for label, _, _ in series] == ["exp", "exp2", "exp3"]
            assert len({marker for _, marker, _ in series}) == 3, "each run needs its own marker, not colour alone"
            assert len({color for _, _, color in series}) == 3
            assert _plot_series(maps) == series  # a run looks the same in both plots
            # l switches to the term both families share, and says so
            await pilot.press("l")
            assert loss.drawn[0] == "training loss (cls)"
            assert "loss: cls (a term every run has)" in str(screen.query_one("#compare-note").render())
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen), "the run list again")

    asyncio.run(go())


def _plot_series(plot: ComparePlot) -> list[tuple[str, str, Any]]:
    """(label, marker, colour) of every series plotext holds (in its active subplot's monitor)."""
    m = plot.plt._active.monitor
    return [(label, marker[0], color[0]) for label, marker, color in zip(m.label, m.marker, m.color, strict=True)]


def test_marked_runs_only(project):
    async def go() -> None:
        app = ConsoleApp(project=project, gpu_sampler=NoGpu())
        async with app.run_test(size=(100, 30)) as pilot:
            await _list_ready(pilot)
            run_list = app.screen.query_one(RunList)
            await pilot.press("space", "down", "space")  # marks the first and the third run (space moves down)
            assert [r.name for r in run_list.marked_runs] == ["exp", "exp3"]
            assert str(run_list.get_cell_at((0, 0))) == "* exp"
            await pilot.press("c")
            screen = await _compare_ready(pilot)
            assert [row[0] for row in _rows(screen)] == ["exp", "exp3"]
            assert screen.query_one("#compare-loss", ComparePlot).names == ["exp", "exp3"]

    asyncio.run(go())


def test_a_live_run_grows_in_the_compare_view(project, tmp_path):
    live = tmp_path / "runs" / "train" / "live"
    write_run(live, _config(batch=8), epochs=3, parts=[(0, 1, None)], t0=T0 + 9000)
    me = psutil.Process()  # the live run's "trainer" is this test's own process
    write_record(live, ProcessRecord(os.getpid(), os.getpgid(0), me.create_time(), ["python"], started=T0 + 9000))

    async def go() -> None:
        app = ConsoleApp(project=project, gpu_sampler=NoGpu())
        async with app.run_test(size=(120, 40)) as pilot:
            await _list_ready(pilot)
            await pilot.press("c")
            screen = await _compare_ready(pilot)
            assert _rows(screen)[0][:3] == ("live", "live", "1/3")
            loss = screen.query_one("#compare-loss", ComparePlot)
            points = len(screen.runs[0].loss_curve()[0])
            w = ev.EventWriter(live / "events.jsonl")
            for e in _epoch_events(1, 3, YOLO9, T0 + 9010, 1.0, 1700.0):
                w.write(e)
            w.close()
            await until(pilot, lambda: _rows(screen)[0][2] == "2/3", "the appended epoch")
            assert _rows(screen)[0][3:5] == ("0.200", "1700")
            assert len(screen.runs[0].loss_curve()[0]) == points + 2
            assert loss.drawn is not None and len(loss.drawn[1][0][2][0]) == points + 2

    asyncio.run(go())


# --- snapshots --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_compare_view_snapshot(snap_compare, project, size):
    async def ready(pilot) -> None:
        await _list_ready(pilot)
        await pilot.press("c")
        await _compare_ready(pilot)

    assert snap_compare(ConsoleApp(project=project, gpu_sampler=NoGpu()), terminal_size=SIZES[size], run_before=ready)
