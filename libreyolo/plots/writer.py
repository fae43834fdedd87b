"""PlotWriter: the one object the training loop hands its plot material to, writing every picture of the run
folder off the loop's path: threads of its own gather each job's arrays (they wait on the device copies and read
the validation images), and kept child processes, forked at the start (libreyolo/forked.py), draw and encode. The
drawing is matplotlib and numpy code that holds the interpreter lock for most of its time (labels.jpg 0.3-0.8 s,
results.png and the curves more): on a thread of the training process it would hold up the loop, which needs the
lock to queue each step. Where fork is not safe (not Linux) or the children died, the threads draw.

Jobs go to LANES lanes, each a thread and a queue, which draw side by side in up to LANES children: a run's end
waits for its final validation's pictures, which one after another take 1.2-2.7 s on an H100 (docs/performance.md).
A picture is always drawn on the same lane, so a lane's order is its files' order: an earlier validation's picture
never overwrites a later one's.

The loop calls it at two places: `train_batch` with each batch as it goes to the device (it keeps a host copy of the
first BATCHES batches of the run's first epoch, and returns at once for every other one), and `validation` with each
finished validation's result (results.png, the curves, the confusion matrices and the predictions' mosaics: at the
final epoch, and before it at most once every `interval_s` seconds, the last skipped one at close(); the labels'
mosaics, the same at every validation, at the first). Jobs wait in a bounded queue: a job that finds it full is
dropped, never waited for. A job that fails is reported once at close(), through `warn`; the run goes on. matplotlib
is optional (the `plots` extra): without it the image mosaics are still written and `warn` says which plots are not."""

from __future__ import annotations

import functools
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
QUEUE = 16  # jobs waiting at most, per lane
# the lanes, balanced by drawing time (results.png and labels.jpg take the longest, then the curves and the
# confusion matrices; the mosaics are quick)
RESULTS, MOSAICS, CURVES, CONFUSION = range(4)
LANES = 4
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
        their images from it); warn: where a one-line warning goes; child: draw in forked child processes (None: where
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
        self._val_labels = False  # val_batchN_labels.jpg submitted
        self._mpl = enabled and figures.available()
        self._queues: list[queue.Queue[Any]] = [queue.Queue(QUEUE) for _ in range(LANES)]
        self._threads: list[threading.Thread] = []
        self._child: KeptChild | None = None
        if not enabled:
            return
        if not self._mpl:
            self.warn(MISSING)
        if can_fork() if child is None else child:
            # one child per lane, at most one per CPU; they load matplotlib at once only where there are more CPUs
            # than lanes: on fewer they would compete with the run's start (and a short run, a test's, never gains)
            cpus = os.cpu_count() or 1
            init = functools.partial(_child_init, self._mpl and cpus > LANES)
            self._child = KeptChild(init, workers=min(LANES, cpus))
            self._child.start()  # forked now, from this thread and before the loop starts, not at the first job
        for lane in range(LANES):
            t = threading.Thread(
                target=self._work, args=(self._queues[lane],), name=f"libreyolo-plots-{lane}", daemon=True
            )
            t.start()
            self._threads.append(t)
        if train_labels is not None and self._mpl and task != "classify":  # a classifier's boxes are whole images
            self._submit(RESULTS, J.labels_job, lambda: (train_labels, self.names, self.run_dir / "labels.jpg"))

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
        self._submit(MOSAICS, J.train_batch_job, lambda: (*J.host_arrays(host, ready), self.names, self.task, path))

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
            if not self._val_labels and self.task != "classify":
                # the validation images' labels are the same at every validation: drawn at the first one even when
                # its other plots are skipped, so that the run's end draws only the predictions (a run of under
                # interval_s plots nothing else before its end)
                self._val_labels = self._submit(MOSAICS, *self._val_mosaics(result, ("labels",)))

    def close(self) -> None:
        """Plot the last validation if it was skipped, let the queued jobs finish, and report what failed."""
        if not self._threads:
            return
        if self._unplotted is not None:
            self._validation_plots(self._unplotted[1])
            self._unplotted = None
        # the jobs ahead of the stop finish first, but a run's end never waits on its pictures for longer than
        # CLOSE_S: a plot thread that is stuck leaves its pictures unwritten, with a warning, and the run ends
        deadline = time.monotonic() + CLOSE_S
        for q in self._queues:
            try:
                q.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = any(t.is_alive() for t in self._threads)
        if stuck:
            self.errors.append(f"the plot threads did not finish within {CLOSE_S:g} s; their pictures were left")
        self._threads = []
        if self._child is not None:
            self._child.close(wait=not stuck)
            self._child = None
        if self.errors:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            self.warn(f"plots: {self.errors[0]}{more}; the run's other files are complete")
        if self.dropped:
            self.warn(f"plots: {self.dropped} plot job(s) dropped: the plot threads fell behind")

    # --- the thread ---------------------------------------------------------------------------------
    def _validation_plots(self, result: dict[str, Any]) -> None:
        if self._mpl and (self.run_dir / "results.csv").exists():
            self._submit(RESULTS, figures.results, lambda: (self.run_dir / "results.csv", self.run_dir / "results.png"))
        names, run_dir, mpl, data = self.names, self.run_dir, self._mpl, self.val_dataset
        if self.task == "classify":
            if "pred" in result:
                label, pred = (np.asarray(result[k], np.int64) for k in ("label", "pred"))
                topk = list(result["topk"])
                self._submit(
                    CONFUSION,
                    J.classify_job,
                    lambda: (label, pred, topk, names, J.misclassified(result, names, data), run_dir, mpl),
                )
            return
        curves, map50, boxes = result.get("curves"), float(result.get("map50", 0.0)), result.get("boxes")
        if mpl and curves is not None:
            self._submit(MOSAICS, J.curves_job, lambda: (curves, names, map50, run_dir, ("pr",)))
            self._submit(CURVES, J.curves_job, lambda: (curves, names, map50, run_dir, ("f1", "p", "r")))
        if mpl and boxes is not None:
            self._submit(CONFUSION, J.confusion_job, lambda: (boxes, names, run_dir))
        kinds = ("pred",) if self._val_labels else ("labels", "pred")
        self._val_labels = self._submit(MOSAICS, *self._val_mosaics(result, kinds)) or self._val_labels

    def _val_mosaics(self, result: dict[str, Any], kinds: tuple[str, ...]) -> tuple[Callable[..., None], Any]:
        names, run_dir, data, val_batch = self.names, self.run_dir, self.val_dataset, self.val_batch
        return J.val_mosaics_job, lambda: (J.val_samples(result, data, val_batch, BATCHES), names, run_dir, kinds)

    def _submit(self, lane: int, fn: Callable[..., None], gather: Callable[[], tuple[Any, ...]]) -> bool:
        """fn(*gather()) drawn off the loop, after the lane's earlier jobs: gather runs on the lane's thread (it may
        wait on the device or read this process's dataset), fn in a child. -> False where the lane's queue was full
        (the job is dropped)."""
        try:
            self._queues[lane].put_nowait((fn, gather))
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _work(self, jobs: queue.Queue[Any]) -> None:
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            fn, gather = job
            try:
                self._draw(fn, gather())
            except Exception as e:  # noqa: BLE001  (a plot never fails the run: reported at close())
                self.errors.append(f"{getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {e}")

    def _draw(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        """In a child where there are children (here once they have died), else here."""
        if self._child is not None:
            self._child.call(fn, *args)
        else:
            fn(*args)


def _child_init(preload: bool) -> None:
    """A drawing child: OpenCV sequential (its thread pool may hang in a forked process, data/decode.py) and a
    lower priority, so that on busy CPUs the training process's threads go first; then matplotlib loaded if asked
    (figures.preload), else by the child's first chart."""
    import cv2

    cv2.setNumThreads(0)
    try:
        os.nice(10)
    except OSError:  # a sandbox may refuse it
        pass
    if preload:
        figures.preload()
