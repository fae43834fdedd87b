"""Find run folders under a project and tell what state each run is in, without reading whole event files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libreyolo.api import DETECT, TASKS
from libreyolo_console.supervisor import RECORD, ProcessRecord, is_alive, read_record, record_alive
from libreyolo_console.tail import LineTail, parse_event

EVENTS = "events.jsonl"
_TAIL_BYTES = 64 << 10  # the end of events.jsonl holds everything a run list needs
_MAX_DEPTH = 3  # runs/ -> train/ -> exp3/


# Finished states come from run_end.status; "live" and "crashed" are the console's own.
LIVE, CRASHED = "live", "crashed"
RESUMABLE = {"interrupted", "failed", CRASHED}


def process_alive(rec: ProcessRecord | None, pid_event: dict[str, Any] | None) -> bool:
    """Is the run's current process running? With a supervisor record: its pid with its start time. For
    a run started by hand (no record): the pid of its latest run_start or heartbeat event, provided that
    process began before the event."""
    if rec is not None:
        return record_alive(rec)
    if pid_event is not None and isinstance(pid_event.get("pid"), int):
        return is_alive(pid_event["pid"], 0.0, started_before=pid_event.get("t", 0.0))
    return False


def classify(
    last_start: dict[str, Any] | None, last_end: dict[str, Any] | None, rec: ProcessRecord | None, alive: bool
) -> str:
    """live, crashed (the process is gone and wrote no run_end after its run_start), or run_end's status."""
    if alive:
        return LIVE
    if last_end is not None and (last_start is None or last_end["t"] >= last_start["t"]):
        # A record newer than the run_end is a later process (a resume) that died before writing anything.
        if rec is None or rec.started <= last_end["t"] + 1.0:
            return str(last_end.get("status", CRASHED))
    return CRASHED


@dataclass
class RunSummary:
    run_dir: Path
    name: str  # relative to the project folder
    status: str
    model: str = "?"
    epoch: int = 0  # epochs completed
    epochs: int = 0
    best_map: float | None = None  # best mAP50-95 seen in the file's tail (another task: its headline metric)
    best_label: str = ""  # "" for detection's mAP50-95, else the headline metric's name (top1), shown beside it
    started: float | None = None  # Unix time of the first run_start (or of the launch)


def find_run_dirs(project: str | os.PathLike[str]) -> list[Path]:
    """Folders under `project` (up to 3 levels deep) that hold an events.jsonl or a supervisor record."""
    root = Path(project)
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        names = {e.name for e in entries}
        if EVENTS in names or RECORD in names:
            found.append(d)
            return
        if depth < _MAX_DEPTH:
            for e in entries:
                if e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                    walk(Path(e.path), depth + 1)

    walk(root, 0)
    return sorted(found)


def read_head_tail(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The first event and the events of the last 64 KiB (complete lines only)."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except FileNotFoundError:
        return None, []
    head = parse_event(first) if first.endswith(b"\n") else None
    return head, [e for e in map(parse_event, LineTail(path, from_end=_TAIL_BYTES).read().lines) if e is not None]


def last_of(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e.get("type") == kind), None)


def summarize(run_dir: Path, project: Path) -> RunSummary:
    head, tail = read_head_tail(run_dir / EVENTS)
    rec = read_record(run_dir)
    last_start, last_end = last_of(tail, "run_start"), last_of(tail, "run_end")
    # a long run's run_start may be older than the tail; its heartbeats (every 10 s) are not
    pid_event = last_start or last_of(tail, "heartbeat")
    status = classify(last_start, last_end, rec, process_alive(rec, pid_event))
    try:
        name = str(run_dir.relative_to(project))
    except ValueError:
        name = str(run_dir)
    s = RunSummary(run_dir, name, status)
    first = head if head is not None and head.get("type") == "run_start" else last_start
    if first is not None:
        s.model, s.epochs, s.started = str(first.get("model", "?")), int(first.get("epochs", 0)), first.get("t")
    elif rec is not None:
        s.started = rec.started
    done = [e["epoch"] + 1 for e in tail if e.get("type") == "epoch_end"]
    current = last_of(tail, "epoch_start")
    s.epoch = max(done) if done else current["epoch"] if current else (last_start or {}).get("start_epoch", 0)
    # detection: mAP50-95; another task (run_start.task): its headline metric, from val.metrics
    task = TASKS.get(str((first or {}).get("task")), DETECT)
    key = task.headline
    s.best_label = "" if task is DETECT else task.label(key)
    vals = [(e.get("metrics") or {}).get(key, e.get(key)) for e in tail if e.get("type") == "val"]
    maps = [v for v in vals if isinstance(v, (int, float))]
    best = (last_end or {}).get("metrics", {}).get(key)
    s.best_map = best if isinstance(best, (int, float)) else max(maps) if maps else None
    return s


def find_runs(project: str | os.PathLike[str]) -> list[RunSummary]:
    """Every run under `project`: live ones first, then the most recently started."""
    project = Path(project)
    runs = [summarize(d, project) for d in find_run_dirs(project)]
    return sorted(runs, key=lambda r: (r.status != LIVE, -(r.started or 0.0), r.name))
