"""PlotWriter: the one object the training loop hands its plot material to, writing every picture of the run
folder off the loop's path: a thread of its own gathers each job's arrays (it waits on the device copies and reads
the validation images), and a kept child process, forked at the start (libreyolo/forked.py), draws and encodes. The
drawing is matplotlib and numpy code that holds the interpreter lock for most of its time (labels.jpg 0.3-0.8 s,
results.png and the curves more): on a thread of the training process it would hold up the loop, which needs the
lock to queue each step. Where fork is not safe (not Linux) or the child died, the thread draws.

The loop calls it at two places: `train_batch` with each batch as it goes to the device (it keeps a host copy of
the first BATCHES batches of the run's first epoch, and returns at once for every other one), and `validation` with
each finished validation's result (results.png, the curves, the confusion matrices and the validation mosaics: at
the final epoch, and before it at most once every `interval_s` seconds, the last skipped one at close()). Jobs
wait in a bounded queue: a job that finds it full is dropped, never waited for. A job that fails is reported once at
close(), through `warn`; the run goes on. matplotlib is optional (the `plots` extra): without it the image mosaics
are still written and `warn` says which plots are not."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from libreyolo.forked import KeptChild, can_fork
from libreyolo.plots import figures
from libreyolo.plots import jobs as J

BATCHES = 3  # train_batch0..2.jpg, val_batch0..2_*.jpg
QUEUE = 16  # jobs waiting at most
INTERVAL_S = 60.0  # the validation plots at most this often before the final epoch
MISSING = (
    'plots: matplotlib is not installed (pip install "libreyolo[plots]"): results.png, the PR/F1/P/R curves, the '
    "confusion matrices and labels.jpg are not written; the image mosaics are"
)
_STOP = object()


CLOSE_S = 30.0


class PlotWriter:
    def __init__(
        self,
        run_dir: str | Path,
        names: list[str],
        task: str,
        enabled: bool = True,
        epochs: int | None = None,
        train_labels: list[np.ndarray] | None = None,
        val_dataset: Any = None,
        val_batch: int = 16,
        warn: Callable[[str], None] | None = None,
        interval_s: float = INTERVAL_S,
        child: bool | None = None,
    ):
        """run_dir: where the pictures go; names: the classes; task: detect or classify; enabled False (plots=false,
        or a rank other than 0): every call returns at once and nothing is written. epochs: the run's epoch count
        (its last validation is always plotted); train_labels: the training split's labels (labels.jpg);
        val_dataset / val_batch: the validation view and its loader's batch size (the validation mosaics reload
        their images from it); warn: where a one-line warning goes; child: draw in a forked child process (None: where
        fork is safe)."""
        self.enabled = enabled
        self.run_dir, self.names, self.task, self.epochs = Path(run_dir), list(names), task, epochs
        self.val_dataset, self.val_batch, self.interval_s = val_dataset, val_batch, interval_s
        self.warn = warn or (lambda msg: None)
        self.errors: list[str] = []
        self.dropped = 0
        self._train_left = BATCHES if enabled else 0
        self._first_epoch: int | None = None
        self._last_val_plot = time.monotonic()  # a run's first plots come after interval_s, or at its end
        self._unplotted: tuple[int, dict[str, Any]] | None = None
        self._mpl = enabled and figures.available()
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE)
        self._thread: threading.Thread | None = None
        self._child: KeptChild | None = None
        if not enabled:
            return
        if not self._mpl:
            self.warn(MISSING)
        if can_fork() if child is None else child:
            self._child = KeptChild(_child_init)
            self._child.start()  # forked now, from this thread and before the loop starts, not at the first job
        self._thread = threading.Thread(target=self._work, name="libreyolo-plots", daemon=True)
        self._thread.start()
        if train_labels is not None and self._mpl and task != "classify":  # a classifier's boxes are whole images
            self._submit(J.labels_job, lambda: (train_labels, self.names, self.run_dir / "labels.jpg"))

    # --- what the loop calls ------------------------------------------------------------------------
    def train_batch(self, epoch: int, img: Any, targets: Any, mask: Any) -> None:
        """A training batch as the network gets it: img (B, H, W, 3) uint8, targets (B, M, 5) class, x1, y1, x2, y2
        in its pixels, mask (B, M). Only the first BATCHES batches of the first epoch seen are kept: copied to the
        host (a device batch without waiting: the copy is queued on the current stream and the thread waits for
        it), drawn on the thread."""
        if self._train_left <= 0:
            return
        if self._first_epoch is None:
            self._first_epoch = epoch
        if epoch != self._first_epoch:
            self._train_left = 0
            return
        k = BATCHES - self._train_left
        self._train_left -= 1
        host, ready = J.to_host((img, targets, mask))
        path = self.run_dir / f"train_batch{k}.jpg"
        self._submit(J.train_batch_job, lambda: (*J.host_arrays(host, ready), self.names, self.task, path))

    def validation(self, epoch: int, result: dict[str, Any]) -> None:
        """A finished validation's result (the task's validation dict: eval/validator.py, eval/topk.py), after its
        results.csv row was written."""
        if not self.enabled:
            return
        final = self.epochs is not None and epoch >= self.epochs - 1
        now = time.monotonic()
        if final or now - self._last_val_plot >= self.interval_s:
            self._last_val_plot, self._unplotted = now, None
            self._validation_plots(result)
        else:
            self._unplotted = (epoch, result)

    def close(self) -> None:
        """Plot the last validation if it was skipped, let the queued jobs finish, and report what failed."""
        if self._thread is None:
            return
        if self._unplotted is not None:
            self._validation_plots(self._unplotted[1])
            self._unplotted = None
        # the jobs ahead of the stop finish first, but a run's end never waits on its pictures for longer than
        # CLOSE_S: a plot thread that is stuck leaves its pictures unwritten, with a warning, and the run ends
        try:
            self._queue.put(_STOP, timeout=CLOSE_S)
        except queue.Full:
            pass
        self._thread.join(timeout=CLOSE_S)
        stuck = self._thread.is_alive()
        if stuck:
            self.errors.append(f"the plot thread did not finish within {CLOSE_S:g} s; its pictures were left")
        self._thread = None
        if self._child is not None:
            self._child.close(wait=not stuck)
            self._child = None
        if self.errors:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            self.warn(f"plots: {self.errors[0]}{more}; the run's other files are complete")
        if self.dropped:
            self.warn(f"plots: {self.dropped} plot job(s) dropped: the plot thread fell behind")

    # --- the thread ---------------------------------------------------------------------------------
    def _validation_plots(self, result: dict[str, Any]) -> None:
        if self._mpl and (self.run_dir / "results.csv").exists():
            self._submit(figures.results, lambda: (self.run_dir / "results.csv", self.run_dir / "results.png"))
        names, run_dir, mpl, data = self.names, self.run_dir, self._mpl, self.val_dataset
        if self.task == "classify":
            if "pred" in result:
                label, pred = (np.asarray(result[k], np.int64) for k in ("label", "pred"))
                topk = list(result["topk"])
                self._submit(
                    J.classify_job,
                    lambda: (label, pred, topk, names, J.misclassified(result, names, data), run_dir, mpl),
                )
            return
        curves, map50, boxes = result.get("curves"), float(result.get("map50", 0.0)), result.get("boxes")
        val_batch = self.val_batch
        self._submit(
            J.detect_job,
            lambda: (curves, map50, boxes, names, J.val_samples(result, data, val_batch, BATCHES), run_dir, mpl),
        )

    def _submit(self, fn: Callable[..., None], gather: Callable[[], tuple[Any, ...]]) -> None:
        """fn(*gather()) drawn off the loop: gather runs on the writer's thread (it may wait on the device or read
        this process's dataset), fn in the child."""
        try:
            self._queue.put_nowait((fn, gather))
        except queue.Full:
            self.dropped += 1

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            fn, gather = job
            try:
                self._draw(fn, gather())
            except Exception as e:  # noqa: BLE001  (a plot never fails the run: reported at close())
                self.errors.append(f"{getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {e}")

    def _draw(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        """In the child where there is one (it draws here once the child has died), else here."""
        if self._child is not None:
            self._child.call(fn, *args)
        else:
            fn(*args)


def _child_init() -> None:
    """The drawing child: OpenCV sequential (its thread pool may hang in a forked process, data/decode.py) and a
    lower priority, so that on busy CPUs the training process's threads go first."""
    import cv2

    cv2.setNumThreads(0)
    try:
        os.nice(10)
    except OSError:  # a sandbox may refuse it
        pass
