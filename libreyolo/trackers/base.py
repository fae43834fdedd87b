"""What every experiment tracker shares: it is a sink of the event stream whose backend calls run on a thread of
their own, so a slow or failing server never holds a training step; the backend's first failure becomes one
warning and the tracker stops, the run goes on.

A backend (mlflow.py, wandb.py) implements `Backend`: start, metrics, artifacts, finish. The tracker turns events
into those calls: params from the run's configuration when the run starts, train losses, learning rates and epoch
time at each `epoch_end`, validation metrics and losses at each `val` (both at step = epoch number, 1-based, as
results.csv and TensorBoard count), and once the run has ended, the run folder's plots (every .png and .jpg),
results.csv, args.yaml and weights/best.pt as artifacts."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from libreyolo import events as ev
from libreyolo.tasks import DETECT, TASKS, Task

# how long the end of a run waits for a tracker's last uploads (best.pt to a server) before leaving them behind
CLOSE_TIMEOUT_S = 120.0
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# folders of the run that hold other tools' files, not the run's plots
NOT_PLOTS = ("wandb", "tensorboard", "weights")
# Ultralytics' mapping of a run's status to MLflow's (W&B has an exit code instead)
STATUS = {"finished": "FINISHED", "early_stop": "FINISHED", "profiled": "FINISHED", "interrupted": "KILLED"}


class Backend(Protocol):
    name: str

    def start(self, run_dir: Path, project: str, params: dict[str, Any], resumed: bool) -> None:
        """resumed: a run continued from its last.pt; the backend continues the run it started then, if it can."""

    def metrics(self, values: dict[str, float], epoch: int) -> None: ...

    def artifacts(self, files: list[tuple[Path, str]]) -> None:
        """(file, the folder it goes in, relative: "" for the top) for each file."""

    def finish(self, status: str) -> None:
        """status: one of STATUS's values, or FAILED."""


class Tracker:
    """A callable sink of events (attach it with the run's sinks) and a `close()` for the run's closers."""

    def __init__(
        self,
        backend: Backend,
        run_dir: Path,
        project: str,
        config: dict[str, Any],
        task: str,
        warn: Callable[[str], None],
        resumed: bool = False,
    ):
        """warn: says one line to the user (an event while the run emits them, stderr after)."""
        self.backend, self.run_dir, self._warn = backend, Path(run_dir), warn
        self._q: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.failed: str | None = None  # the backend's first error; nothing is sent after it
        self._reported = False
        self._skipped = 0  # events that could not be read: the first is a warning, the tracker goes on
        self._task: Task = TASKS.get(task, DETECT)  # results.csv's column names are the task's
        self._end: ev.RunEnd | None = None
        self._thread = threading.Thread(target=self._work, name=f"libreyolo-{backend.name}", daemon=True)
        self._q.put(("start", (self.run_dir, project, params_of(config), resumed)))
        self._thread.start()

    # --- the training side: only queue puts, never a backend call ------------------------------------
    def __call__(self, e: ev.Event) -> None:
        if self.failed is not None:
            if e.type != "run_end":  # the events after run_end are none: close() reports it then
                self._report()
            return
        try:
            self._on(e)
        except Exception as exc:  # noqa: BLE001 - an event the tracker cannot read must not end the run either
            if not self._skipped:
                self._warn(f"{self.backend.name}: skipped {e.type} events it cannot read ({type(exc).__name__}: {exc})")
            self._skipped += 1

    def _on(self, e: ev.Event) -> None:
        if isinstance(e, ev.EpochEnd):
            values = {**_losses("train", e.losses), **{f"lr/{k}": v for k, v in e.lr.items()}}
            values.update({"speed/epoch_s": e.time_s, "speed/img_s": e.img_s})
            if e.fitness is not None:
                values["fitness"] = e.fitness
            self._q.put(("metrics", (_numbers(values), e.epoch + 1)))
        elif isinstance(e, ev.Val):
            metrics = {metric_key(m.column): e.metrics[m.name] for m in self._task.metrics if m.name in e.metrics}
            self._q.put(("metrics", (_numbers({**metrics, **_losses("val", e.losses)}), e.epoch + 1)))
        elif isinstance(e, ev.RunEnd):
            self._end = e

    def close(self) -> None:
        """After the run's other closers (the plots are written by then): queue the artifacts and the end, and wait
        up to CLOSE_TIMEOUT_S for them."""
        end = self._end
        status = STATUS.get(end.status, "FAILED") if end is not None else "FAILED"
        best = Path(end.best) if end is not None and end.best else self.run_dir / "weights" / "best.pt"
        self._q.put(("artifacts", (self._artifacts(best),)))
        self._q.put(("finish", (status,)))
        self._q.put(None)
        t0 = time.monotonic()
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            self._warn(
                f"{self.backend.name}: still sending after {time.monotonic() - t0:.0f} s at the end of the run; "
                "left behind (the run's own files are complete)"
            )
        self._report()

    # --- the tracker's thread ------------------------------------------------------------------------
    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            if self.failed is not None:
                continue  # drained and dropped: one warning, no retries
            what, args = item
            try:
                getattr(self.backend, what)(*args)
            except Exception as e:  # noqa: BLE001 - any failure of the tracker's backend must not end the run
                self.failed = f"{type(e).__name__}: {e}"

    def _report(self) -> None:
        if self.failed is not None and not self._reported:
            self._reported = True
            self._warn(f"{self.backend.name} failed ({self.failed}); the run goes on without it")

    def _artifacts(self, best: Path) -> list[tuple[Path, str]]:
        d = self.run_dir
        plots = sorted(
            p
            for p in d.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES and p.relative_to(d).parts[0] not in NOT_PLOTS and p.is_file()
        )
        files = [(p, str(Path("plots", *p.relative_to(d).parts[:-1]))) for p in plots]
        files += [(d / f, "") for f in ("results.csv", "args.yaml") if (d / f).is_file()]
        if best.is_file():
            files.append((best, "weights"))
        return files


def params_of(config: dict[str, Any]) -> dict[str, str]:
    """The run's keys as a tracker's params: every key but the Python-only callbacks, values as text."""
    return {k: str(v) for k, v in sorted(config.items()) if k not in ("callbacks", "family_args")}


def metric_key(column: str) -> str:
    """results.csv's column name as a metric name MLflow accepts (letters, digits, _ - . / : and spaces):
    metrics/mAP50-95(B) -> metrics/mAP50-95B, as Ultralytics' MLflow logging names it."""
    return re.sub(r"[^\w\-. /:]", "", column)


def _losses(prefix: str, losses: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}_loss": v for k, v in losses.items()}


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    """The values that are numbers (a metric the run could not compute is None: left out), as floats."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
