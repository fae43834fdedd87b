"""Run folders: runs/train/exp, exp2, ...; args.yaml; results.csv with the Ultralytics column names (the metric
columns are the task's: libreyolo/tasks/); the folder a resumed run continues in; one writer per folder."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from libreyolo.errors import CheckpointError, ConfigError, DiskFullError, disk_full_in
from libreyolo.tasks import DETECT, Task

try:
    import fcntl
except ImportError:  # Windows: no advisory locks of this kind; a run folder is then not guarded
    fcntl = None  # type: ignore[assignment]

METRIC_COLUMNS = list(DETECT.columns)  # detection's, for readers of detection runs' results.csv


def results_columns(loss_terms: list[str] | tuple[str, ...], param_groups: int, task: Task = DETECT) -> list[str]:
    """The Ultralytics layout, built from the family's loss terms, its task's metrics and the optimizer's parameter
    groups."""
    return [
        "epoch",
        "time",
        *(f"train/{t}_loss" for t in loss_terms),
        *task.columns,
        *(f"val/{t}_loss" for t in loss_terms),
    ] + [f"lr/pg{j}" for j in range(param_groups)]


def results_row(
    epoch: int,
    time_s: float,
    train_losses: dict[str, float],
    metrics: dict[str, float],
    val_losses: dict[str, float],
    lrs: list[float],
    task: Task = DETECT,
) -> dict[str, float]:
    """One results.csv row; metrics holds the task's metrics by name."""
    row = {
        "epoch": epoch,
        "time": round(time_s, 1),
        **{f"train/{t}_loss": v for t, v in train_losses.items()},
        **{f"val/{t}_loss": v for t, v in val_losses.items()},
        **{f"lr/pg{j}": lr for j, lr in enumerate(lrs)},
    }
    row.update((m.column, metrics[m.name]) for m in task.metrics)
    return row


def increment_run_dir(project: str | os.PathLike[str], name: str, exist_ok: bool) -> Path:
    """project/name if free (or exist_ok), else the first free project/name2, name3, ... (created atomically)."""
    project = Path(project)
    project.mkdir(parents=True, exist_ok=True)
    path = project / name
    if exist_ok:
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = re.sub(r"\d+$", "", name) if (project / name).exists() else name
    n = 1
    while True:
        candidate = project / (name if n == 1 else f"{base}{n}")
        try:
            candidate.mkdir(parents=False)  # atomic: two runs started together never share a folder
            return candidate
        except FileExistsError:
            n += 1


def write_args(run_dir: Path, args: dict[str, Any]) -> None:
    clean = {k: (v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v)) for k, v in args.items()}
    with disk_full_named(run_dir / "args.yaml"):
        (run_dir / "args.yaml").write_text(yaml.safe_dump(clean, sort_keys=False))


def append_results(path: Path, row: dict[str, float], columns: list[str]) -> None:
    """One row, written whole or not at all: a write that fails (a full disk) is cut back to where the file ended."""
    new = not path.exists()
    lines = io.StringIO()
    w = csv.writer(lines)
    if new:
        w.writerow(columns)
    w.writerow([_fmt(row.get(c, "")) for c in columns])
    with disk_full_named(path):
        append_whole(path, lines.getvalue().encode())


def append_whole(path: str | os.PathLike[str], data: bytes) -> None:
    """Append data to path, all of it or none: after a failed write (a full disk) the file is cut back to its
    length before, so a reader never meets half a line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def disk_full_named(path: str | os.PathLike[str]) -> Iterator[None]:
    """A full disk while writing path raises DiskFullError naming it (one line), not an OSError traceback."""
    try:
        yield
    except OSError as e:
        if disk_full_in(e) and not isinstance(e, DiskFullError):
            raise DiskFullError.at(path) from e
        raise


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def resumed_run_dir(last_pt: str | os.PathLike[str], stored: str | os.PathLike[str] | None, notes: list[str]) -> Path:
    """The folder a resumed run writes into: the one its last.pt lies in (RUN/weights/last.pt -> RUN), never the
    run_dir stored inside the checkpoint, which names where the run was first started: a copied run resumed from
    the copy would otherwise write into the original, a moved one re-create its old path. Where the two differ,
    a note says so."""
    weights = Path(last_pt).absolute().parent
    if weights.name != "weights":
        raise CheckpointError(
            f"{last_pt} is not in a run folder's weights/ (RUN/weights/last.pt), so there is no folder to continue "
            f"its results.csv and events in; put it at RUN/weights/last.pt (e.g. {weights / 'run' / 'weights'}) "
            "and resume from there"
        )
    run_dir = weights.parent
    if stored is not None and _same_place(run_dir, Path(stored)) is False:
        notes.append(
            f"this run was started in {stored}; it continues in {run_dir}, the folder of {Path(last_pt).name} "
            f"(the other folder is not written)"
        )
    return run_dir


def _same_place(a: Path, b: Path) -> bool | None:
    """Whether two run folders are one (the same inode when both exist: a path through a link counts as the same),
    None where that cannot be told."""
    try:
        if b.exists():
            return os.path.samefile(a, b)
    except OSError:
        return None
    return a.resolve() == b.absolute().resolve()


LOCK_NAME = ".libreyolo.lock"  # in the run folder; holds the pid of the process writing the folder
_held: dict[str, tuple[int, int]] = {}  # run folder (real path) -> (lock file descriptor, holds) of this process


def lock_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Make this process the run folder's one writer, or raise ConfigError naming the process that is (two runs in
    one folder mix their results.csv rows, events and checkpoints). An flock on RUN/.libreyolo.lock: the kernel
    releases it when the process ends however it ends (kill -9 included), so a dead run never blocks its resume.
    Within one process the lock is counted, not refused: a run that failed before releasing it does not block the
    next run of the same process. unlock_run_dir releases it."""
    if fcntl is None:
        return
    key = os.path.realpath(run_dir)
    if key in _held:
        fd, n = _held[key]
        _held[key] = (fd, n + 1)
        return
    fd = os.open(os.path.join(key, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"run folder {run_dir} is being written by another libreyolo process (pid {holder}); two runs in one "
            "folder would mix their results.csv, events.jsonl and checkpoints. Wait for that run to end (or stop it: "
            f"kill {holder}) and try again, or train into another folder (name=..., without exist_ok=true)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = (fd, 1)


def unlock_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Release what lock_run_dir took (the last release of this process frees the folder)."""
    key = os.path.realpath(run_dir)
    if key not in _held:
        return
    fd, n = _held.pop(key)
    if n > 1:
        _held[key] = (fd, n - 1)
    else:
        os.close(fd)  # closing the descriptor releases the flock
