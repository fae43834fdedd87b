"""Start, watch and stop `libreyolo train` processes that outlive the console.

A run is launched in a session of its own (so an SSH hangup or closing the console never reaches it), with
stdin from /dev/null and stdout+stderr appended to run_dir/stdout.log. Its identity (pid, process group,
process start time, command line) is written to run_dir/supervisor.json, so any later console can tell
whether the run is still alive: the pid must exist *and* have the recorded start time, otherwise the pid
has been reused by an unrelated process."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from libreyolo.api import increment_run_dir

RECORD = "supervisor.json"
STDOUT_LOG = "stdout.log"
# psutil derives create_time from boot time + start ticks; the same process always yields the same value,
# so a tight tolerance is safe and still rejects any pid reused later.
_START_TOLERANCE_S = 0.05

# Processes this console started: kept so their exit status is collected (no zombies while we live).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass
class ProcessRecord:
    """What identifies one training process of a run (the run dir holds the latest one)."""

    pid: int
    pgid: int
    create_time: float
    cmdline: list[str]
    started: float
    stop: dict[str, Any] | None = None  # filled in when the console stopped it: {"ended_by": "SIGINT", "seconds": 2.1}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def read_record(run_dir: str | os.PathLike[str]) -> ProcessRecord | None:
    """The run's supervisor record, or None when it has none (a run started outside the console)."""
    path = Path(run_dir) / RECORD
    try:
        d = json.loads(path.read_text())
        return ProcessRecord(
            **{k: d[k] for k in ("pid", "pgid", "create_time", "cmdline", "started")}, stop=d.get("stop")
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        # A damaged record must not hide the run; it is then treated like one started by hand.
        return None


def write_record(run_dir: str | os.PathLike[str], rec: ProcessRecord) -> None:
    path = Path(run_dir) / RECORD
    tmp = path.with_name(f".{RECORD}.{os.getpid()}.tmp")
    tmp.write_text(rec.to_json())
    os.replace(tmp, path)  # a reader never sees half a record


def is_alive(pid: int, create_time: float, started_before: float | None = None) -> bool:
    """True if `pid` is a running process with that start time (or, with `started_before`, one that
    started before that Unix time: how a run without a record is checked against its run_start event)."""
    _reap(pid)
    try:
        p = psutil.Process(pid)
        ct = p.create_time()
        if started_before is not None:
            if ct > started_before + _START_TOLERANCE_S:
                return False
        elif abs(ct - create_time) > _START_TOLERANCE_S:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # exists with a matching start time, owned by someone else


def record_alive(rec: ProcessRecord | None) -> bool:
    return rec is not None and is_alive(rec.pid, rec.create_time)


def _reap(pid: int) -> None:
    p = _CHILDREN.get(pid)
    if p is not None and p.poll() is not None:
        del _CHILDREN[pid]


def train_argv(args: list[str]) -> list[str]:
    """The process to run for `libreyolo train ARGS`: this interpreter, so the console and the trainer
    always use the same installation (the `libreyolo` script on PATH may belong to another one)."""
    return [sys.executable, "-m", "libreyolo.cli.main", "train", *args]


def launch(run_dir: str | os.PathLike[str], cmd: list[str], title: str | None = None) -> ProcessRecord:
    """Start `cmd` detached from this console (own session, stdin /dev/null), appending its output to
    run_dir/stdout.log after a `$ title` line, and record it in run_dir/supervisor.json."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # stdout.log shows lines as they are printed
    with open(run_dir / STDOUT_LOG, "ab") as log:
        log.write(f"$ {title or shlex.join(cmd)}\n".encode())
        log.flush()
        p = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    _CHILDREN[p.pid] = p
    # The child is ours and not yet waited for, so even if it already exited it is a zombie we can read.
    ct = psutil.Process(p.pid).create_time()
    rec = ProcessRecord(pid=p.pid, pgid=p.pid, create_time=ct, cmdline=cmd, started=time.time())
    write_record(run_dir, rec)
    return rec


def start_run(project: str | os.PathLike[str], args: list[str], name: str = "exp") -> tuple[Path, ProcessRecord]:
    """Pick a free run folder under `project` (created atomically), then train into exactly that folder."""
    run_dir = increment_run_dir(project, name, False).resolve()
    full = [*args, f"project={run_dir.parent}", f"name={run_dir.name}", "exist_ok=true"]
    return run_dir, launch(run_dir, train_argv(full), shlex.join(["libreyolo", "train", *full]))


def last_checkpoint(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "weights" / "last.pt"


def resume_run(run_dir: str | os.PathLike[str]) -> ProcessRecord:
    """Continue a stopped or crashed run from its last.pt (the trainer appends to the same run folder)."""
    last = last_checkpoint(run_dir)
    if not last.is_file():
        raise FileNotFoundError(
            f"{last} does not exist: the run stopped before its first checkpoint; start a new run instead"
        )
    args = [f"resume={last}"]
    return launch(run_dir, train_argv(args), shlex.join(["libreyolo", "train", *args]))


@dataclass
class StopResult:
    ended_by: str | None  # the signal after which the process was gone; None if it was already gone
    seconds: float
    sent: list[str] = field(default_factory=list)
    alive: bool = False  # still running after SIGKILL (uninterruptible sleep, or another user's process)

    def describe(self) -> str:
        if self.alive:
            return f"still running after {', '.join(self.sent)} ({self.seconds:.1f} s)"
        if self.ended_by is None:
            return "the process had already exited"
        return f"stopped by {self.ended_by} after {self.seconds:.1f} s" + (
            f" (sent {', '.join(self.sent)})" if len(self.sent) > 1 else ""
        )


# SIGINT lets the trainer save last.pt and write run_end; the timeouts give that time before escalating.
LADDER: tuple[tuple[signal.Signals, float], ...] = (
    (signal.SIGINT, 60.0),
    (signal.SIGTERM, 20.0),
    (signal.SIGKILL, 10.0),
)


def stop(
    rec: ProcessRecord,
    ladder: tuple[tuple[signal.Signals, float], ...] = LADDER,
    group: bool = True,
    on_signal: Callable[[str, float], object] | None = None,
    cancel: threading.Event | None = None,
    poll_s: float = 0.1,
) -> StopResult:
    """Signal the run: SIGINT, then SIGTERM, then SIGKILL, each after the previous one's timeout. The
    process group is signalled (`group`, for runs the console started: that reaches DDP ranks and loader
    workers), and only while its leader is verified alive, so a recycled pid or pgid is never hit.
    `cancel` abandons the escalation (the console is quitting; a SIGINT already sent still stops the run)."""
    t0 = time.monotonic()
    sent: list[str] = []
    cancel = cancel or threading.Event()
    for sig, timeout in ladder:
        if not record_alive(rec):
            return StopResult(sent[-1] if sent else None, time.monotonic() - t0, sent)
        try:
            os.killpg(rec.pgid, sig) if group else os.kill(rec.pid, sig)
        except ProcessLookupError:
            return StopResult(sent[-1] if sent else None, time.monotonic() - t0, sent)
        sent.append(sig.name)
        if on_signal is not None:
            on_signal(sig.name, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not record_alive(rec):
                return StopResult(sig.name, time.monotonic() - t0, sent)
            if cancel.wait(poll_s):
                return StopResult(None, time.monotonic() - t0, sent, alive=record_alive(rec))
    return StopResult(None, time.monotonic() - t0, sent, alive=record_alive(rec))


@dataclass
class ProcInfo:
    pid: int
    role: str  # "main", "rank N" (a DDP worker) or "worker" (a data loader process)
    cpu_percent: float
    rss_mb: float


class ProcessTree:
    """The run's process tree: the launcher, one line per DDP rank (found by the RANK variable the launcher
    sets), and its data-loader workers. psutil.Process objects are kept between samples because CPU % is
    measured between two calls on the same object."""

    def __init__(self, pid: int):
        self.pid = pid
        self._procs: dict[int, psutil.Process] = {}
        self._roles: dict[int, str] = {}  # a process's role never changes: read its environment once

    def sample(self) -> list[ProcInfo]:
        try:
            root = self._procs.get(self.pid) or psutil.Process(self.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        self._procs = {p.pid: self._procs.get(p.pid, p) for p in found}
        self._roles = {
            pid: self._roles.get(pid) or ("main" if pid == self.pid else _role(p)) for pid, p in self._procs.items()
        }
        out = []
        for p in self._procs.values():
            try:
                with p.oneshot():
                    out.append(
                        ProcInfo(p.pid, self._roles[p.pid], p.cpu_percent(interval=None), p.memory_info().rss / 2**20)
                    )
            except psutil.Error:
                continue
        return out


def _role(p: psutil.Process) -> str:
    try:
        rank = p.environ().get("RANK")
    except psutil.Error:
        rank = None
    return f"rank {rank}" if rank is not None else "worker"


def adopt(pid: int, started_before: float) -> ProcessRecord | None:
    """A record for a run started outside the console (from its run_start event's pid and time), so it can
    be watched and stopped too; None if that pid is not the run's process any more."""
    if not is_alive(pid, 0.0, started_before=started_before):
        return None
    try:
        p = psutil.Process(pid)
        return ProcessRecord(
            pid=pid, pgid=os.getpgid(pid), create_time=p.create_time(), cmdline=p.cmdline(), started=p.create_time()
        )
    except (psutil.Error, ProcessLookupError):
        return None
