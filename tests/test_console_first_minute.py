"""What a newcomer meets in the first minute: keys answer while the new-run form's modules import, and
quitting with a live run says how to come back to it."""

import asyncio
import os
import signal
import sys
import time

import pytest
import torch  # noqa: F401  (imported here: the form's load in these tests is the fixture's sleep alone)
from conftest import run_start_event
from console_driver import own_settings, until

import libreyolo.api
from libreyolo_console import app as console_app
from libreyolo_console.app import ConsoleApp, main
from libreyolo_console.runs import LIVE
from libreyolo_console.screens.loading import FormLoading
from libreyolo_console.screens.new_run import NewRunScreen
from libreyolo_console.screens.run import RunScreen
from libreyolo_console.screens.runs import RunsScreen
from libreyolo_console.supervisor import launch, read_record, record_alive

LOAD_S = 2.0  # the stand-in for a cold `import torch`


@pytest.fixture(autouse=True)
def _own_settings(tmp_path, monkeypatch):
    own_settings(tmp_path, monkeypatch)


@pytest.fixture
def slow_import(monkeypatch):
    """The form's heavy import takes LOAD_S seconds, deterministically (torch is already imported here)."""
    real = libreyolo.api.model_names

    def slow() -> list[str]:
        time.sleep(LOAD_S)
        return real()

    monkeypatch.setattr(libreyolo.api, "model_names", slow)


async def timed_press(pilot, key: str) -> float:
    t = time.monotonic()
    await pilot.press(key)
    return time.monotonic() - t


def test_keys_pressed_while_the_form_loads_take_effect(tmp_path, slow_import):
    async def run() -> None:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            # no runs yet: the demo form is asked for at once, and a loading screen answers while it imports
            await until(pilot, lambda: isinstance(app.screen, FormLoading), "the loading screen", 2)
            assert "loading the new-run form" in str(app.screen.query_one("#loading-note").render())
            assert await timed_press(pilot, "escape") < LOAD_S / 2  # answered now, not after the import
            assert isinstance(app.screen, RunsScreen)
            assert await timed_press(pilot, "n") < LOAD_S / 2
            assert isinstance(app.screen, FormLoading) and app.model_names is None
            await pilot.press("tab")  # kept for the form: from Start to Cancel
            assert "1 key(s) kept" in str(app.screen.query_one("#loading-note").render())
            await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form", LOAD_S + 10)
            await until(pilot, lambda: app.focused is not None and app.focused.id == "cancel", "the kept tab", 2)
            await pilot.press("enter")  # Cancel: back to the list
            assert isinstance(app.screen, RunsScreen)
            await pilot.press("n")  # loaded now: the form at once
            assert isinstance(app.screen, NewRunScreen)

    asyncio.run(run())


def test_q_while_the_form_loads_quits_at_once(tmp_path, slow_import):
    t = [0.0]

    async def run() -> None:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, FormLoading), "the loading screen", 2)
            t[0] = time.monotonic()
            await pilot.press("q")

    asyncio.run(run())
    assert time.monotonic() - t[0] < LOAD_S / 2  # gone, without waiting for the import to finish


@pytest.fixture
def live_stand_in(tmp_path):
    """A live run as the console sees one: a process started by the supervisor, with its record."""
    run_dir = tmp_path / "runs" / "exp"
    rec = launch(run_dir, [sys.executable, "-c", "import time; time.sleep(60)"])
    yield run_dir
    if record_alive(read_record(run_dir)):
        os.killpg(rec.pgid, signal.SIGKILL)


@pytest.mark.parametrize("attach", [False, True])
def test_quitting_with_a_live_run_says_it_keeps_training_and_how_to_reattach(
    tmp_path, live_stand_in, attach, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the command names the folder from where the console was started

    async def run() -> str:
        app = ConsoleApp(project=tmp_path / "runs", attach=live_stand_in if attach else None, gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            if attach:
                await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.status == LIVE, "live")
            else:
                await until(pilot, lambda: getattr(app.screen, "loaded", False), "the run list")
            await pilot.press("q")
        return app.goodbye

    said = asyncio.run(run())
    assert "1 run(s) keep training" in said
    assert said.splitlines()[1:] == ["  libreyolo-console attach runs/exp"]
    assert record_alive(read_record(live_stand_in))


def test_main_prints_the_reattach_command_after_the_terminal_is_restored(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "exp"

    def fake_run(self: ConsoleApp) -> None:  # the terminal is the test's: only what comes after run() is checked
        self.goodbye = console_app.farewell([run_dir])

    monkeypatch.setattr(ConsoleApp, "run", fake_run)
    assert main(["--project", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "keep training" in out and "  libreyolo-console attach runs/exp\n" in out


def test_the_first_paint_does_not_wait_for_torch():
    """Everything the run list needs imports without torch or OpenCV (the face, libreyolo.api, loads neither; the
    form's modules follow in a thread)."""
    import subprocess

    code = "import sys, libreyolo_console.app; print([m for m in ('torch', 'cv2') if m in sys.modules])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def _resumed_run(run_dir, epochs: int = 30) -> None:
    """Two processes: epoch 1 in 34 s, interrupted; resumed 66 s later, epoch 2 in 24 s, interrupted again."""
    from libreyolo import events as ev

    w = ev.EventWriter(run_dir / "events.jsonl")
    t0 = time.time() - 3600
    for part, (start, took) in enumerate(((t0, 34.0), (t0 + 100, 24.0))):
        w.write(
            run_start_event(
                run_dir=str(run_dir),
                data="shapes",
                epochs=epochs,
                start_epoch=part,
                cuda_graph_reason="eager on cpu",
                optimizer="SGD",
                steps_per_epoch=4,
                train_images=32,
                params=1000,
                pid=9_999_999,
                resumed=part > 0,
                t=start,
            )
        )
        w.write(ev.EpochStart(epoch=part, epochs=epochs, steps=4, mosaic=True, t=start + 1))
        losses = {"box": 1.0, "cls": 1.0, "dfl": 1.0}
        w.write(ev.EpochEnd(epoch=part, losses=losses, lr={"pg0": 0.01}, time_s=took - 2, img_s=9.0, fitness=0.1,
                            best_fitness=0.1, skipped_images=0, t=start + took - 1))  # fmt: skip
        w.write(ev.RunEnd(status="interrupted", epochs_done=part + 1, best_fitness=0.1, best=None, last=None,
                          time_s=took, metrics={}, t=start + took))  # fmt: skip
    w.close()


def test_a_resumed_run_counts_epochs_done_and_their_time_alike_in_the_list_and_the_view(tmp_path):
    from libreyolo_console.widgets.progress import ProgressPanel
    from libreyolo_console.widgets.run_list import RunList

    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    _resumed_run(run_dir)

    async def run() -> tuple[list[str], str, str]:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: getattr(app.screen, "loaded", False), "the run list")
            table = app.screen.query_one(RunList)
            columns = [str(c.label) for c in table.columns.values()]
            row = dict(zip(columns, map(str, table.get_row_at(0)), strict=True))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.status != "?", "the run")
            await pilot.pause(0.6)  # a redraw
            status = str(app.screen.query_one("#run-status").render())
            progress = str(app.screen.query_one(ProgressPanel).render())
            return [f"{k}={v}" for k, v in row.items()], status, progress

    row, status, progress = asyncio.run(run())
    assert "epochs done=2/30" in row
    assert "interrupted" in status and "epochs done 2/30 in 0:58 over 2 processes" in status  # 34 s + 24 s
    assert progress.startswith("epochs done 2/30  ")


def test_long_log_lines_wrap_at_80_columns_and_w_toggles_it(tmp_path):
    from libreyolo_console.widgets.log_tail import LogTail

    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    _resumed_run(run_dir)
    long = "warning: " + " ".join(f"word{i}" for i in range(40)) + " END"  # about 280 characters
    (run_dir / "stdout.log").write_text(f"short line\n{long}\n")

    async def run() -> None:
        app = ConsoleApp(project=tmp_path / "runs", attach=run_dir, gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run view")
            screen = app.screen
            assert not screen.check_action("wrap", ())  # not on the overview: the footer does not offer it
            await pilot.press("6")
            log = screen.query_one(LogTail)
            await until(pilot, lambda: len(log.kept) == 2 and log.lines, "the log lines")
            await pilot.pause(0.2)
            assert screen.check_action("wrap", ())
            shown = [row.rstrip() for row in log.lines]
            assert log.virtual_size.width <= log.scrollable_content_region.width  # nothing to scroll sideways
            assert len(shown) > 3 and shown[-1].endswith("END") and "".join(shown).count("word") == 40
            await pilot.press("w")
            await pilot.pause(0.2)
            assert not log.wrap and [row.rstrip() for row in log.lines] == ["short line", long]
            assert log.virtual_size.width > 80
            await pilot.press("w")
            await pilot.pause(0.2)
            assert log.wrap and log.virtual_size.width <= log.scrollable_content_region.width

    asyncio.run(run())


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_empty_panels_say_what_would_fill_them(device):
    from libreyolo_console.state import RunState
    from libreyolo_console.widgets import graph_log, verdict, vram

    s = RunState()
    s.start = {"device": device, "config": {"profile": False}}
    on_cpu = device == "cpu"
    assert ("profile=true" in verdict.empty_hint(s)) and ("works on cpu" in verdict.empty_hint(s)) == on_cpu
    assert ("CUDA graphs run on NVIDIA GPUs, and this run is on cpu" in graph_log.empty_hint(s)) == on_cpu
    assert ("VRAM is a GPU's memory, and this run is on cpu" in vram.empty_hint(s)) == on_cpu
    s.start["config"]["profile"] = True  # asked for: the verdict comes after the window
    assert verdict.empty_hint(s) == verdict.WAITING


@pytest.mark.parametrize("cuda", [True, False])
def test_the_demo_profiles_a_window_when_a_gpu_is_there(tmp_path, monkeypatch, tiny_data, cuda):
    """On a GPU the demo fills every panel: its form suggests profile=true (spelled out in the command);
    a dataset of the user's own goes back to the trainer's defaults. Without CUDA nothing changes."""
    monkeypatch.setattr(console_app, "load_form", lambda: (libreyolo.api.model_names(), cuda))

    async def run() -> None:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form")
            form = app.screen.query_one("#form")
            command = lambda: str(app.screen.query_one("#command").render())  # noqa: E731
            assert form.values()["profile"] == ("true" if cuda else "false")
            assert command().startswith("$ libreyolo train profile=true\n" if cuda else "$ libreyolo train\n")
            form.set_value("data", str(tiny_data))
            await pilot.pause(0.1)
            assert form.values()["profile"] == "false" and "profile=" not in command()

    asyncio.run(run())


def test_the_form_opens_when_a_dialog_over_the_loading_screen_closes(tmp_path, slow_import):
    async def run() -> None:
        app = ConsoleApp(project=tmp_path / "runs", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, FormLoading), "the loading screen", 2)
            await pilot.press("ctrl+p")  # the command palette over it while the import finishes
            await until(pilot, lambda: app.model_names is not None, "the import", LOAD_S + 10)
            assert not isinstance(app.screen, (FormLoading, NewRunScreen))
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form", 5)

    asyncio.run(run())
