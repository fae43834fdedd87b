"""console.supervisor and console.runs with small stand-in processes (no trainer): detachment, the signal
ladder, pid-reuse detection, DDP rank discovery, and how a run folder's state is classified."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import run_start_event

from libreyolo import events as ev
from libreyolo_console import supervisor
from libreyolo_console.runs import CRASHED, LIVE, classify, find_runs
from libreyolo_console.supervisor import ProcessRecord, ProcessTree, is_alive, launch, read_record, record_alive, stop

FAST_LADDER = ((signal.SIGINT, 1.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0))


@pytest.fixture
def spawned():
    """Every process group a test starts is SIGKILLed at the end, whatever happened."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _ready(run_dir):
    """The stand-in printed its `ready` line (the log's first line is the command, which contains the word)."""
    log = run_dir / "stdout.log"
    assert _wait_for(lambda: any(line.startswith("ready") for line in log.read_text().splitlines()[1:])), (
        log.read_text()
    )


# the stand-ins take Ctrl-C as `libreyolo train` does (cli/train.py restores it even when this test session was
# started in the background, where SIGINT arrives ignored)
DEFAULT_INT = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
IGNORE = DEFAULT_INT + "import signal, sys, time\n{ignores}print('ready', flush=True)\ntime.sleep(60)\n"


def test_launch_detaches_records_identity_and_logs(tmp_path, spawned):
    code = (
        "import os, sys, time\nprint('stdin:', repr(sys.stdin.read()), flush=True)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    rec = launch(tmp_path, _py(code), "stand-in")
    spawned.append(rec.pgid)
    _ready(tmp_path)
    assert read_record(tmp_path) == rec
    p = psutil.Process(rec.pid)
    assert rec.create_time == p.create_time() and rec.cmdline == p.cmdline()
    # its own session and group: a hangup of the console's terminal (SSH drop) never reaches it
    assert os.getsid(rec.pid) == rec.pid == rec.pgid != os.getsid(0)
    log = (tmp_path / "stdout.log").read_text()
    assert log.startswith("$ stand-in\n") and "stdin: ''" in log  # stdin is /dev/null, not the terminal
    assert record_alive(rec)


def test_liveness_needs_the_same_start_time_so_a_reused_pid_is_not_mistaken(tmp_path, spawned):
    me = psutil.Process()
    assert is_alive(me.pid, me.create_time())
    assert not is_alive(me.pid, me.create_time() - 30)  # same pid, another process (a reused pid)
    assert not is_alive(me.pid, 0.0, started_before=me.create_time() - 30)  # began after the run's event
    assert is_alive(me.pid, 0.0, started_before=me.create_time() + 1)
    rec = launch(tmp_path, _py("pass"))
    spawned.append(rec.pgid)
    # exited (and, as our child, reaped by the liveness check instead of lingering as a zombie)
    assert _wait_for(lambda: not record_alive(rec))
    assert not psutil.pid_exists(rec.pid) or psutil.Process(rec.pid).create_time() != rec.create_time


@pytest.mark.parametrize(
    "ignores, ended_by",
    [
        ("", "SIGINT"),
        ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n", "SIGTERM"),
        ("signal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n", "SIGKILL"),
    ],
)
def test_stop_climbs_the_ladder_and_reports_the_step_that_ended_it(tmp_path, spawned, ignores, ended_by):
    rec = launch(tmp_path, _py(IGNORE.format(ignores=ignores)))
    spawned.append(rec.pgid)
    _ready(tmp_path)
    seen = []
    result = stop(rec, FAST_LADDER, on_signal=lambda name, t: seen.append(name))
    assert result.ended_by == ended_by and not result.alive
    assert seen == ["SIGINT", "SIGTERM", "SIGKILL"][: seen.index(ended_by) + 1]
    assert not record_alive(rec)
    assert ended_by in result.describe()


def test_stop_signals_the_whole_group_and_not_a_dead_run(tmp_path, spawned):
    code = (
        DEFAULT_INT + "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGINT, "
        "signal.default_int_handler); time.sleep(60)'])\n"
        "print('ready', c.pid, flush=True)\ntime.sleep(60)\n"
    )
    rec = launch(tmp_path, _py(code))
    spawned.append(rec.pgid)
    _ready(tmp_path)
    child = int((tmp_path / "stdout.log").read_text().splitlines()[-1].split()[1])
    assert stop(rec, FAST_LADDER).ended_by == "SIGINT"
    assert _wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE)
    # already gone: nothing is sent (a recycled pgid would otherwise be signalled)
    again = stop(rec, FAST_LADDER)
    assert again.ended_by is None and again.sent == [] and "already exited" in again.describe()


def test_process_tree_lists_ranks_by_their_rank_variable(tmp_path, spawned):
    code = (
        "import os, subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "env={**os.environ, 'RANK': str(r)}) for r in (0, 1)]\n"
        "kids.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']))\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    rec = launch(tmp_path, _py(code))
    spawned.append(rec.pgid)
    _ready(tmp_path)
    tree = ProcessTree(rec.pid)
    assert _wait_for(lambda: len(tree.sample()) == 4)
    roles = sorted(p.role for p in tree.sample())
    assert roles == ["main", "rank 0", "rank 1", "worker"]


def test_adopt_a_run_started_by_hand_only_while_its_pid_is_that_process(spawned):
    p = subprocess.Popen(_py("import time; time.sleep(60)"), start_new_session=True)
    spawned.append(p.pid)
    try:
        rec = supervisor.adopt(p.pid, time.time() + 1)
        assert rec is not None and rec.pid == p.pid and record_alive(rec)
        assert (
            supervisor.adopt(p.pid, psutil.Process(p.pid).create_time() - 60) is None
        )  # the pid is newer than the run
    finally:
        p.kill()
        p.wait()


# --- run folders: what state is each run in? ---------------------------------------------------------
def _events(run_dir, *items):
    w = ev.EventWriter(run_dir / "events.jsonl")
    for e in items:
        w.write(e)
    w.close()


def _start(pid=1, t=1000.0, epochs=3):
    return run_start_event(run_dir="x", nc=3, names=["a", "b", "c"], epochs=epochs, pid=pid, t=t)


def _end(status, t=2000.0):
    return ev.RunEnd(
        status=status, epochs_done=1, best_fitness=0.5, best=None, last=None, time_s=12.0, metrics={"map": 0.42}, t=t
    )


def test_classify_uses_run_end_liveness_and_the_record():
    s, e = {"t": 10.0}, {"t": 20.0, "status": "interrupted"}
    assert classify(s, e, None, alive=False) == "interrupted"
    assert classify(s, None, None, alive=False) == CRASHED
    assert classify(s, None, None, alive=True) == LIVE
    assert classify({"t": 30.0}, e, None, alive=False) == CRASHED  # a later process (resume) started and died
    resumed = ProcessRecord(pid=1, pgid=1, create_time=0.0, cmdline=[], started=25.0)
    assert classify(s, e, resumed, alive=False) == CRASHED  # launched after run_end, died before writing anything
    assert classify(None, None, None, alive=False) == CRASHED


def test_find_runs_reports_finished_crashed_live_and_reused_pid(tmp_path, spawned):
    project = tmp_path / "runs"
    (project / "exp").mkdir(parents=True)
    _events(
        project / "exp",
        _start(),
        ev.Val(epoch=0, precision=1, recall=1, map50=0.6, map=0.42, losses={}, images=8, time_s=1, eval_s=0.5),
        ev.EpochEnd(epoch=0, losses={}, lr={}, time_s=1, img_s=1, fitness=0.5, best_fitness=0.5, skipped_images=0),
        _end("finished"),
    )
    (project / "exp2").mkdir()
    # pid 1 exists, but its start time is not the recorded one: the run's process is gone, the pid reused
    _events(project / "exp2", _start(pid=1))
    supervisor.write_record(
        project / "exp2", ProcessRecord(pid=1, pgid=1, create_time=12.0, cmdline=["x"], started=999.0)
    )
    live = launch(project / "nested" / "exp3", _py("import time; print('ready', flush=True); time.sleep(60)"))
    spawned.append(live.pgid)
    # started by hand (no record): run_start's pid is this test process, which began before the event
    (project / "exp4").mkdir()
    _events(project / "exp4", _start(pid=os.getpid(), t=time.time()))
    (project / "exp5").mkdir()
    _events(project / "exp5", _start(pid=os.getpid(), t=psutil.Process().create_time() - 100))  # pid reused since
    # a long run started by hand: run_start has scrolled out of the file's tail, its heartbeats have not
    (project / "exp6").mkdir()
    _events(
        project / "exp6",
        _start(pid=os.getpid(), t=time.time()),
        *[ev.Heartbeat(epoch=0, step=i, pid=os.getpid()) for i in range(1500)],
    )
    got = {r.name: r for r in find_runs(project)}
    assert got["exp"].status == "finished" and got["exp"].epoch == 1 and got["exp"].best_map == pytest.approx(0.42)
    assert got["exp2"].status == CRASHED
    assert got["nested/exp3"].status == LIVE
    assert got["exp4"].status == LIVE
    assert got["exp5"].status == CRASHED
    assert got["exp6"].status == LIVE and got["exp6"].model == "LibreYOLO9t"
    assert got["exp"].model == "LibreYOLO9t" and got["exp"].epochs == 3


def test_a_run_view_under_another_keeps_its_state_but_neither_draws_nor_polls(tmp_path, monkeypatch):
    import asyncio

    from libreyolo_console.app import ConsoleApp
    from libreyolo_console.screens.run import RunScreen

    monkeypatch.setenv("LIBREYOLO_CONSOLE_CONFIG", str(tmp_path / "console.yaml"))
    project = tmp_path / "runs"
    for name in ("a", "b"):
        (project / name).mkdir(parents=True)
        _events(project / name, _start(), _end("finished"))

    async def until(pilot, cond, seconds=30.0):
        deadline = time.monotonic() + seconds
        while not cond() and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert cond()

    async def go():
        app = ConsoleApp(project=project, attach=project / "a", gpu_interval=0.5)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.status == "finished")
            a = app.screen
            calls = {"draw": 0, "poll": 0}
            monkeypatch.setattr(a, "show_status", lambda: calls.__setitem__("draw", calls["draw"] + 1))
            monkeypatch.setattr(a, "check_process", lambda: calls.__setitem__("poll", calls["poll"] + 1))
            app.open_run(project / "b")
            await until(
                pilot,
                lambda: app.screen is not a and isinstance(app.screen, RunScreen) and app.screen.status == "finished",
            )
            _events(project / "a", ev.WarningEvent(message="late news"))  # a's file grows while b is shown
            await until(pilot, lambda: a.state.warnings)  # its tail still reads
            await pilot.pause(1.5)  # several redraw ticks and a process check would have come by now
            assert calls == {"draw": 0, "poll": 0}
            app.pop_screen()
            await until(pilot, lambda: app.screen is a and calls["draw"] >= 1 and calls["poll"] >= 1, 5.0)  # at once

    asyncio.run(go())
