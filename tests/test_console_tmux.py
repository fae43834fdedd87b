"""A person's test, scripted with tmux: start the console, start a run from the form, kill the tmux session
(what an SSH drop does: the console gets SIGHUP), start a new console, re-attach, and watch the run go on.
Skipped where tmux is not installed (.ci/run installs it)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from libreyolo_console.supervisor import read_record, record_alive

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """A private tmux server (its own socket), so the test neither sees nor touches anyone else's sessions."""

    def __init__(self, env: dict[str, str]):
        self.socket = f"libreyolo-test-{uuid.uuid4().hex[:8]}"
        self.env = env

    def __call__(self, *args: str) -> str:
        r = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=self.env, timeout=30)
        return r.stdout

    def start(self, name: str, cmd: list[str]) -> None:
        # a session that outlives the others keeps the server up: killing a console's session (the SSH drop) must
        # not leave the next new-session racing the server's exit
        if not self.exists("keep"):
            self("new-session", "-d", "-s", "keep", "sleep 3600")
        self("new-session", "-d", "-s", name, "-x", "80", "-y", "24", " ".join(cmd))
        # a console that exits at once leaves its last screen (a traceback) for wait() to report
        self("set-option", "-t", name, "remain-on-exit", "on")

    def exists(self, name: str) -> bool:
        r = subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", name], capture_output=True, env=self.env)
        return r.returncode == 0

    def screen(self, name: str, joined: bool = False) -> str:
        """The pane's text; joined: lines the terminal wrapped are given back whole."""
        return self("capture-pane", "-p", *(["-J"] if joined else []), "-t", name)

    def wait(self, name: str, pred, what: str, timeout: float = 60.0, joined: bool = False) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen(name, joined)
            if pred(text):
                return text
            time.sleep(0.3)
        state = "" if self.exists(name) else f" (tmux has no session {name!r})"
        pytest.fail(f"timed out waiting for {what}{state}; the screen was:\n{text}")

    def keys(self, name: str, *keys: str, literal: bool = False) -> None:
        self("send-keys", "-t", name, *(["-l"] if literal else []), *keys)


def _form_field(screen: str, key: str) -> str:
    """The text in a form field (not the help beside it, which may contain the same words)."""
    row = next((line for line in screen.splitlines() if line.startswith(f" {key} ")), "")
    return row[13:39].strip()


def _tab_to_model(tmux: Tmux, name: str) -> None:
    """Tab until the model field has the focus. The form focuses Start once it is shown, and Textual may
    apply that after keys already sent (two tabs then end on Cancel), so each tab waits for what it did."""
    for _ in range(24):  # more than one turn through the form's fields and buttons
        before = tmux.screen(name)
        tmux.keys(name, "Tab")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and tmux.screen(name) == before:
            time.sleep(0.1)
        if " model: " in tmux.screen(name):
            return
    pytest.fail(f"the model field never took the focus; the screen was:\n{tmux.screen(name)}")


def _fill_form(tmux: Tmux, name: str, data, epochs: int) -> None:
    """From the model field, tab to each field, clear it and type its value, as a person would."""
    for key, value in (
        ("data", str(data)),
        ("epochs", str(epochs)),
        ("batch", "8"),
        ("imgsz", "64"),
        ("device", "cpu"),
    ):
        tmux.keys(name, "Tab")
        tmux.wait(name, lambda s, k=key: f" {k}: " in s, f"focus on {key}")
        tmux.keys(name, "C-u")
        # Textual runs a key binding's action after already-queued characters: wait for the clear
        tmux.wait(name, lambda s, k=key: not _form_field(s, k), f"{key} cleared")
        tmux.keys(name, value, literal=True)
        tmux.wait(
            name,
            lambda s, k=key, v=value: v.endswith(_form_field(s, k)) and _form_field(s, k),
            f"{key}={value} in the form",
        )


EPOCHS = 60


def test_console_survives_an_ssh_drop_and_a_new_console_reattaches(tiny_data, tmp_path):
    env = {**os.environ, "LIBREYOLO_CONSOLE_CONFIG": str(tmp_path / "console.yaml"), "TERM": "xterm-256color"}
    env.pop("TMUX", None)
    tmux = Tmux(env)
    project = tmp_path / "runs"
    console = [sys.executable, "-m", "libreyolo_console", "--project", str(project)]
    run_dir = None
    try:
        tmux.start("first", console)
        tmux.wait("first", lambda s: "$ libreyolo train" in s and "Start" in s, "the new-run form")
        # tab from Start past Cancel to the fields, typing as a person would (waiting for each to show up)
        _tab_to_model(tmux, "first")
        # enough epochs that the run is still going through the drop and the re-attach: an epoch of the tiny
        # set takes about a second on the CPU machine, so a short run could end before the checks below
        _fill_form(tmux, "first", tiny_data, epochs=EPOCHS)
        tmux.keys("first", "C-s")
        screen = tmux.wait(
            "first",
            lambda s: "live pid" in s and re.search(r"step [1-9]\d*/", s) is not None,
            "the run view with a first step",
            120,
        )
        done = int(re.search(rf"epochs done (\d+)/{EPOCHS}", screen).group(1))
        assert done < EPOCHS // 2, screen
        run_dir = next(p for p in project.iterdir() if p.is_dir())
        rec = read_record(run_dir)
        console_pid = int(tmux("list-panes", "-t", "first", "-F", "#{pane_pid}").split()[0])

        tmux("kill-session", "-t", "first")  # the SSH connection drops: the console's terminal hangs up
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _exists(console_pid):
            time.sleep(0.1)
        assert not _exists(console_pid), "the console survived its terminal"
        assert record_alive(rec), "the run died with the console's terminal"

        tmux.start("second", [*console, "attach", str(run_dir)])
        first = tmux.wait("second", lambda s: "live pid" in s and "step" in s, "the re-attached live run")
        before = re.search(rf"epochs done \d+/{EPOCHS}  step \d+/\d+", first).group(0)
        after = tmux.wait(
            "second",
            lambda s: (
                (m := re.search(rf"epochs done \d+/{EPOCHS}  step \d+/\d+", s)) is not None
                and m.group(0) != before
                or "finished" in s
            ),
            "the run to progress in the new console",
            180,
        )
        assert "libreyolo-console" in after and "training loss" in after
        # (the run is not waited for: the cleanup below ends it)
    finally:
        tmux("kill-server")
        if run_dir is not None:
            rec = read_record(run_dir)
            if rec is not None and record_alive(rec):
                os.killpg(rec.pgid, signal.SIGKILL)


PROGRESS = re.compile(r"epochs done \d+/\d+  step \d+/\d+")


def test_two_live_runs_outlive_the_console_and_each_reattaches_from_the_list(tiny_data, tmp_path):
    """Two runs started from one console, its tmux session killed: both keep training, a new console lists
    both live, and re-attaches to each in turn (each one's own pid, each progressing); quitting it prints
    the command that re-attaches to each."""
    env = {**os.environ, "LIBREYOLO_CONSOLE_CONFIG": str(tmp_path / "console.yaml"), "TERM": "xterm-256color"}
    env.pop("TMUX", None)
    tmux = Tmux(env)
    project = tmp_path / "runs"
    console = [sys.executable, "-m", "libreyolo_console", "--project", str(project)]
    try:
        tmux.start("first", console)
        for i in range(2):
            if i:
                tmux.keys("first", "n")  # from the first run's view
            tmux.wait("first", lambda s: "$ libreyolo train" in s and "Start" in s, "the new-run form")
            _tab_to_model(tmux, "first")
            _fill_form(tmux, "first", tiny_data, epochs=EPOCHS)  # long enough to outlive the rest of the test
            tmux.keys("first", "C-s")
            tmux.wait(
                "first",
                lambda s, n=i: f"— exp{n + 1 if n else ''}" in s and "live pid" in s and PROGRESS.search(s),
                f"run {i + 1}'s view with a first step",
                120,
            )
        recs = {p.name: read_record(p) for p in project.iterdir()}
        assert sorted(recs) == ["exp", "exp2"]
        console_pid = int(tmux("list-panes", "-t", "first", "-F", "#{pane_pid}").split()[0])

        tmux("kill-session", "-t", "first")  # the SSH connection drops
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _exists(console_pid):
            time.sleep(0.1)
        assert not _exists(console_pid), "the console survived its terminal"
        assert all(record_alive(r) for r in recs.values()), "a run died with the console's terminal"

        tmux.start("second", console)  # the run list, both live (what it prints after quitting stays on screen)
        tmux.wait("second", lambda s: len(re.findall(r"exp2? +live", s)) == 2, "both runs live in the list")
        seen = set()
        for row in range(2):
            if row:
                tmux.keys("second", "Down")
            tmux.keys("second", "Enter")
            first = tmux.wait("second", lambda s: "live pid" in s and PROGRESS.search(s), "a re-attached run")
            pid = int(re.search(r"live pid (\d+)", first).group(1))
            before = PROGRESS.search(first).group(0)
            tmux.wait(
                "second",
                lambda s, b=before: (m := PROGRESS.search(s)) is not None and m.group(0) != b,
                f"run of pid {pid} to progress in the new console",
                120,
            )
            seen.add(pid)
            tmux.keys("second", "Escape")
            tmux.wait("second", lambda s: "Runs under" in s, "the run list again")
        assert seen == {r.pid for r in recs.values()}  # each run re-attached, not one of them twice

        tmux.keys("second", "q")
        said = tmux.wait(
            "second",
            lambda s: "keep training" in s,
            "the re-attach commands printed after quitting",
            joined=True,
        )
        for name in recs:
            assert f"libreyolo-console attach {project / name}" in said, said
        assert all(record_alive(r) for r in recs.values()), "quitting stopped a run"
    finally:
        tmux("kill-server")
        for d in project.iterdir() if project.exists() else ():
            rec = read_record(d)
            if rec is not None and record_alive(rec):
                os.killpg(rec.pgid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")
    except OSError:
        return False
