"""The console driven by Textual's Pilot against a real `libreyolo train` subprocess on the tiny dataset:
start from the form, panels follow the events, Stop climbs the signal ladder, Resume continues, quitting
leaves the run training, and re-attaching rebuilds the finished run."""

import asyncio
import os
import re
import signal
import sys
import time

import console_driver as driver
import pytest

from libreyolo import events as ev
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.events import read_events
from libreyolo_console.app import ConsoleApp, main
from libreyolo_console.runs import CRASHED, LIVE
from libreyolo_console.screens.dialogs import ConfirmScreen
from libreyolo_console.screens.new_run import NewRunScreen
from libreyolo_console.screens.run import RunScreen
from libreyolo_console.screens.runs import RunsScreen
from libreyolo_console.supervisor import launch, read_record, record_alive
from libreyolo_console.widgets.epochs import EpochTable
from libreyolo_console.widgets.progress import ProgressPanel
from libreyolo_console.widgets.run_form import RunForm


@pytest.fixture(autouse=True)
def _own_settings(tmp_path, monkeypatch):
    driver.own_settings(tmp_path, monkeypatch)


@pytest.fixture
def runs_started():
    """Run folders whose trainer must not outlive the test, whatever happened."""
    dirs = []
    yield dirs
    for d in dirs:
        rec = read_record(d)
        if rec is not None and record_alive(rec):
            os.killpg(rec.pgid, signal.SIGKILL)


async def until(pilot, pred, what: str, timeout: float = 120.0) -> None:
    """console_driver.until with a real trainer's patience: it starts and steps on 2 busy cores."""
    await driver.until(pilot, pred, what, timeout, every=0.2)


async def fill(pilot, field: str, text: str) -> None:
    """Type into a form field as a person would: focus it, clear it, type."""
    pilot.app.screen.query_one(f"#field-{field}").focus()
    await pilot.press("end", "ctrl+u", *text)


async def start_tiny_run(pilot, data, epochs: int) -> RunScreen:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the new-run form (there are no runs yet)", 30)
    for field, text in (
        ("data", str(data)),
        ("epochs", str(epochs)),
        ("batch", "8"),
        ("imgsz", "64"),
        ("device", "cpu"),
        ("workers", "0"),
        ("more", "log_interval=0.1"),
    ):
        await fill(pilot, field, text)
    shown = str(app.screen.query_one("#command").render())
    assert (
        f"libreyolo train data={data} epochs={epochs} batch=8 imgsz=64 device=cpu workers=0 log_interval=0.1" in shown
    )
    await pilot.press("ctrl+s")
    await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run view", 10)
    return app.screen


def test_run_lifecycle_start_quit_reattach_stop_resume_quit_reattach(tiny_data, tmp_path, runs_started):
    """One run through everything a person does with it (two trainer processes in all, to keep CI short):
    start it from the form and quit the console; re-attach, stop it, resume it, quit again; it finishes on
    its own; a third console shows it finished."""
    run_dir = asyncio.run(_start_and_quit(tiny_data, tmp_path, runs_started))
    rec = read_record(run_dir)
    assert record_alive(rec), "quitting the console stopped the run"

    resumed = asyncio.run(_reattach_stop_resume_quit(run_dir, rec, tmp_path))
    assert resumed.pid != rec.pid and record_alive(resumed), "quitting the console stopped the resumed run"
    deadline = time.monotonic() + 240
    while record_alive(resumed) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not record_alive(resumed), "the resumed run did not finish on its own"
    assert [e["status"] for e in read_events(run_dir / "events.jsonl") if e["type"] == "run_end"] == [
        "interrupted",
        "finished",
    ]
    assert "interrupted" in (run_dir / "stdout.log").read_text()  # both processes logged to the same file

    asyncio.run(_reattach_finished(run_dir, tmp_path))


LIFECYCLE_EPOCHS = 8


async def _start_and_quit(tiny_data, tmp_path, runs_started):
    app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        # long enough to still be live when the next console re-attaches on an idle machine
        screen = await start_tiny_run(pilot, tiny_data, epochs=LIFECYCLE_EPOCHS)
        run_dir = screen.run_dir
        runs_started.append(run_dir)
        assert run_dir.parent == (tmp_path / "runs").resolve() and run_dir.name == "exp"
        assert read_record(run_dir).cmdline[-3:] == [f"project={run_dir.parent}", "name=exp", "exist_ok=true"]
        await until(pilot, lambda: screen.state.last_step is not None, "the first step event")
        assert screen.status == LIVE
        await pilot.pause(0.5)  # one redraw
        progress = str(screen.query_one(ProgressPanel).render())
        assert re.search(rf"epochs done \d+/{LIFECYCLE_EPOCHS}", progress) and "img/s" in progress
        assert screen.state.losses and "live" in str(screen.query_one("#run-status").render())
        await pilot.press("q")
    return run_dir


async def _reattach_stop_resume_quit(run_dir, rec, tmp_path):
    app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded, "the run list", 20)
        assert "live" in str(app.screen.query_one("#run-list").get_row_at(0))
        await pilot.press("enter")  # open the live run: every panel is rebuilt from events.jsonl
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run view", 10)
        screen = app.screen
        await until(pilot, lambda: screen.state.start is not None and screen.state.losses, "the rebuilt run")
        assert screen.status == LIVE and screen.record.pid == rec.pid

        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the stop confirmation", 5)
        await pilot.press("y")
        await until(pilot, lambda: screen.status == "interrupted", "the run to end interrupted", 90)
        await until(pilot, lambda: "stopped by SIGINT" in screen.stop_note, "the stop report")
        assert read_record(run_dir).stop["ended_by"] == "SIGINT"
        ck = load_checkpoint(run_dir / "weights" / "last.pt")
        assert "train" in ck and ck["epoch"] < LIFECYCLE_EPOCHS  # stopped mid-run: there is something to resume
        assert [e["status"] for e in read_events(run_dir / "events.jsonl") if e["type"] == "run_end"] == ["interrupted"]

        await pilot.press("r")
        await until(pilot, lambda: screen.status == LIVE, "the resumed process", 10)
        resumed = read_record(run_dir)
        await pilot.press("q")
    return resumed


async def _reattach_finished(run_dir, tmp_path):
    again = ConsoleApp(project=tmp_path / "runs", attach=run_dir, gpu_interval=0.5)
    async with again.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(again.screen, RunScreen), "the attached run", 10)
        screen = again.screen
        await until(pilot, lambda: screen.status == "finished" and screen.state.end is not None, "the finished state")
        await pilot.pause(0.5)
        assert "100%" in str(screen.query_one(ProgressPanel).render())
        assert screen.state.epochs_done == LIFECYCLE_EPOCHS
        assert screen.query_one("#epoch-table", EpochTable).row_count == LIFECYCLE_EPOCHS
        assert not screen.check_action("stop", ()) and not screen.check_action("resume", ())
        await pilot.press("escape")  # back to the run list, which shows it finished
        await until(pilot, lambda: "finished" in str(again.screen.query_one("#run-list").get_row_at(0)), "the run list")


def test_a_run_that_died_without_run_end_shows_crashed_with_its_last_output(tmp_path, runs_started):
    run_dir = tmp_path / "runs" / "exp"
    w = ev.EventWriter(run_dir / "events.jsonl")
    rec = launch(
        run_dir,
        [
            sys.executable,
            "-c",
            "print('RuntimeError: CUDA error: out of memory', flush=True)\nimport time; time.sleep(60)",
        ],
    )
    runs_started.append(run_dir)
    w.write(ev.Heartbeat(epoch=0, step=3, pid=rec.pid))
    w.close()
    deadline = time.monotonic() + 20
    while "out of memory" not in (run_dir / "stdout.log").read_text().splitlines()[-1] and time.monotonic() < deadline:
        time.sleep(0.05)
    asyncio.run(_crash_then_resume(run_dir, rec, tmp_path))
    assert not record_alive(rec)


async def _crash_then_resume(run_dir, rec, tmp_path):
    app = ConsoleApp(project=tmp_path / "runs", attach=run_dir, gpu_interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.status == LIVE, "the live stand-in", 10
        )
        screen = app.screen
        os.killpg(rec.pgid, signal.SIGKILL)  # dies without run_end, as after an OOM kill
        await until(pilot, lambda: screen.status == CRASHED, "the crashed state", 10)
        note = screen.query_one("#crash-note")
        assert (
            note.display
            and "out of memory" in str(note.render())
            and "exited without writing run_end" in str(note.render())
        )
        assert screen.check_action("resume", ()) and not screen.check_action("stop", ())
        await pilot.press("r")  # no last.pt: says so instead of starting a trainer that would fail
        await pilot.pause(0.3)
        assert any("start a new run instead" in n.message for n in app._notifications)


@pytest.mark.parametrize("theme", ["libreyolo-dark", "libreyolo-light", "libreyolo-high-contrast"])
def test_every_theme_renders_and_t_cycles_and_remembers_it(tmp_path, theme, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")  # the monochrome filter must cope with every theme too

    async def run() -> str:
        app = ConsoleApp(project=tmp_path / "runs", theme=theme, gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form", 20)
            assert app.theme == theme and app.no_color
            app.screen.query_one("#start").focus()
            await pilot.press("t")
            await pilot.pause(0.2)
            return app.theme

    after = asyncio.run(run())
    assert after != theme
    assert (tmp_path / "console.yaml").read_text().strip() == f"theme: {after}"


def test_form_follows_the_dataset_defaults_and_refuses_what_the_cli_would(tiny_data, tmp_path):
    async def run() -> None:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form", 20)
            form, screen = app.screen.query_one(RunForm), app.screen
            command = lambda: str(screen.query_one("#command").render())  # noqa: E731
            error = lambda: str(screen.query_one("#form-error").render())  # noqa: E731
            assert form.values()["epochs"] == "30" and command().startswith("$ libreyolo train\n")  # the demo
            await fill(pilot, "epochs", "7")
            await fill(pilot, "data", str(tiny_data))
            values = form.values()
            assert values["epochs"] == "7" and values["imgsz"] == "640"  # untouched fields follow the real dataset
            assert f"libreyolo train data={tiny_data} epochs=7\n" in command()
            await fill(pilot, "imgsz", "100")
            assert "imgsz=" in error() and "multiple of 32" in error()
            await pilot.press("ctrl+s")
            await fill(pilot, "imgsz", "64")
            await fill(pilot, "data", str(tmp_path / "missing.yaml"))
            await pilot.press("ctrl+s")
            await pilot.pause(0.2)
            assert "missing.yaml" in error() and "does not exist" in error()
            assert isinstance(app.screen, NewRunScreen) and not (tmp_path / "runs").exists()  # nothing was started

    asyncio.run(run())


def test_attach_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["attach", str(tmp_path)])
    assert e.value.code == 2 and f"{tmp_path} is not a run folder" in capsys.readouterr().err


def test_command_palette_offers_the_console_commands(tmp_path):
    async def run() -> str:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form", 20)
            await pilot.press("ctrl+p")
            await pilot.pause(0.3)
            await pilot.press(*"theme: libreyolo-light")
            await pilot.pause(0.5)
            await pilot.press("enter")
            await pilot.pause(0.3)
            return app.theme

    assert asyncio.run(run()) == "libreyolo-light"
