"""RunState: everything the run view shows, folded from the event stream.

The panels render from this object only, so re-attaching (reading events.jsonl from the start) and
watching live (applying new events as they arrive) build exactly the same view.

The loss terms are the model family's (run_start.loss_terms, in order); nothing here knows any family's
names. A version-1 file has no loss_terms: the terms are then the keys of the losses dicts, in the order
they first appear. Likewise the validation metrics are the task's (run_start.task and .metrics, libreyolo.tasks);
files before version 3 are detection runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libreyolo.api import DETECT, TASKS, EtaEstimator, Task

MAX_POINTS = 2000  # loss-curve points kept; older ones are thinned so a week-long run stays cheap to plot


@dataclass
class EpochRow:
    epoch: int
    losses: dict[str, float] = field(default_factory=dict)  # exact mean training loss per term (epoch_end)
    metrics: dict[str, float] = field(default_factory=dict)  # val.metrics: the task's metrics by name
    # detection's four (None for other tasks), as the compare view and the run list read them
    precision: float | None = None
    recall: float | None = None
    map50: float | None = None
    map: float | None = None
    time_s: float | None = None  # the whole epoch, validation included
    img_s: float | None = None
    val_s: float | None = None  # val.time_s: how long validation held the training loop
    eval_s: float | None = None  # val.eval_s: the COCO evaluation, often in the background (None in v1 files)
    images: int | None = None  # val.images: images validated
    # val.per_class (v5, detection): a row per class (class, images, instances, precision, recall, map50, map);
    # None where the trainer wrote none (not a best so far, not the final epoch) or an older file
    per_class: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not self.metrics and self.map is not None:  # a row built with detection's four
            four = (self.precision, self.recall, self.map50, self.map)
            self.metrics = {k: float(v) for k, v in zip(DETECT.metric_names, four) if v is not None}


@dataclass
class RunState:
    start: dict[str, Any] | None = None  # the latest run_start
    end: dict[str, Any] | None = None  # run_end of the current process (None while it runs)
    starts: int = 0  # processes that trained this run (1 + resumes)
    epoch: int = 0
    epochs: int = 0
    step: int = 0
    steps: int = 0
    mosaic: bool | None = None
    last_step: dict[str, Any] | None = None
    terms: tuple[str, ...] = ()  # the family's loss terms, in order
    task: Task = DETECT  # run_start.task: what the metrics are and how the best epoch is chosen
    metrics: tuple[str, ...] = DETECT.metric_names  # run_start.metrics (v3), in order
    # (fractional epoch, {term: mean loss since the epoch began}) per step event
    losses: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    rows: dict[int, EpochRow] = field(default_factory=dict)
    checkpoint: dict[str, Any] | None = None
    graphs: list[dict[str, Any]] = field(default_factory=list)
    vram: list[dict[str, Any]] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    t0: float | None = None  # time of the file's first event: graph lines are timed from it
    last_t: float | None = None  # time of the newest event (heartbeats included)
    bad_lines: int = 0
    eta: EtaEstimator = field(default_factory=EtaEstimator)  # "estimating…", then a range (libreyolo.eta)
    trained_s: float = 0.0  # wall time of the processes that ended (run_end.time_s, or their events' span)
    _part_t0: float | None = None  # run_start time of the process still open (no run_end yet)
    _before: float | None = None  # the newest event's time before the one being applied
    _declared: bool = False  # terms came from a run_start (v2): the losses dicts no longer add any
    _thin: int = 1  # keep every _thin-th step event once MAX_POINTS was reached
    _seen: int = 0

    def apply(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            self._before, self.last_t = self.last_t, e.get("t", self.last_t)
            if self.t0 is None:
                self.t0 = self.last_t
            handler = getattr(self, "_on_" + str(e.get("type")), None)
            if handler is not None:
                try:
                    handler(e)
                except (KeyError, TypeError, ValueError):
                    self.bad_lines += 1  # a malformed event must not take the view down

    # --- handlers -----------------------------------------------------------------------------------
    def _on_run_start(self, e: dict[str, Any]) -> None:
        if self._part_t0 is not None and self._before is not None:  # the previous process died without run_end
            self.trained_s += max(self._before - self._part_t0, 0.0)
        self._part_t0 = float(e["t"])
        self.start, self.end, self.last_step = e, None, None
        self.starts += 1
        self.epochs = e["epochs"]
        self.epoch = e["start_epoch"]
        self.steps = e["steps_per_epoch"]
        self.step = 0
        self.eta.reset()  # a resumed process warms up again
        self.task = TASKS.get(str(e.get("task")), DETECT)
        self.metrics = tuple(map(str, e.get("metrics") or self.task.metric_names))  # absent before version 3
        terms = e.get("loss_terms")  # absent in version-1 files
        if isinstance(terms, list) and terms:
            self.terms, self._declared = tuple(map(str, terms)), True

    def _learn_terms(self, losses: dict[str, Any]) -> None:
        """A version-1 file names its terms only as the keys of its losses dicts."""
        if not self._declared:
            self.terms += tuple(k for k in losses if k not in self.terms)

    def _on_epoch_start(self, e: dict[str, Any]) -> None:
        self.epoch, self.epochs, self.steps, self.mosaic = e["epoch"], e["epochs"], e["steps"], e["mosaic"]
        self.step = 0

    def _on_step(self, e: dict[str, Any]) -> None:
        self.last_step = e
        self.epoch, self.step, self.steps = e["epoch"], e["step"], e["steps"]
        self.eta.update(e["epoch"], e["step"], e["steps"], self.epochs, float(e["eta_s"]))
        lo = e["losses"]
        x = e["epoch"] + e["step"] / max(e["steps"], 1)
        if self.losses and x < self.losses[-1][0]:
            # a resumed process replays from its checkpoint: drop the points it will redraw
            self.losses = [p for p in self.losses if p[0] < x]
        self._learn_terms(lo)
        self._seen += 1
        if self._seen % self._thin == 0 and lo:  # no losses yet this epoch: nothing to plot
            self.losses.append((x, {str(k): float(v) for k, v in lo.items()}))
        if len(self.losses) > MAX_POINTS:
            self.losses = self.losses[::2]
            self._thin *= 2

    def _row(self, epoch: int) -> EpochRow:
        return self.rows.setdefault(epoch, EpochRow(epoch))

    def _on_val(self, e: dict[str, Any]) -> None:
        r = self._row(e["epoch"])
        four = {k: e.get(k) for k in DETECT.metric_names}  # the only metrics before version 3
        metrics = e.get("metrics") or four
        r.metrics = {str(k): float(v) for k, v in metrics.items() if v is not None}
        r.precision, r.recall, r.map50, r.map = (four[k] for k in DETECT.metric_names)
        r.val_s, r.eval_s = e["time_s"], e.get("eval_s")  # (no eval_s in version-1 files)
        r.images = e.get("images")
        rows = e.get("per_class")
        r.per_class = [dict(x) for x in rows if isinstance(x, dict)] if isinstance(rows, list) else None

    def _on_epoch_end(self, e: dict[str, Any]) -> None:
        r = self._row(e["epoch"])
        self._learn_terms(e["losses"])
        r.losses = {str(k): float(v) for k, v in e["losses"].items()}
        r.time_s, r.img_s = e["time_s"], e["img_s"]
        if e["epoch"] + 1 < self.epochs:
            self.epoch, self.step = e["epoch"] + 1, 0
        else:
            self.epoch, self.step = e["epoch"], self.steps

    def _on_checkpoint(self, e: dict[str, Any]) -> None:
        self.checkpoint = e

    def _on_graph(self, e: dict[str, Any]) -> None:
        self.graphs.append(e)

    def _on_vram(self, e: dict[str, Any]) -> None:
        self.vram = [v for v in self.vram if v["epoch"] != e["epoch"]] + [e]

    def _on_profile(self, e: dict[str, Any]) -> None:
        self.profile = e

    def _on_warning(self, e: dict[str, Any]) -> None:
        self.warnings.append(e)

    def _on_run_end(self, e: dict[str, Any]) -> None:
        self.end = e
        self.trained_s += float(e["time_s"])
        self._part_t0 = None

    # --- derived ------------------------------------------------------------------------------------
    @property
    def epochs_done(self) -> int:
        return max((r.epoch + 1 for r in self.rows.values() if r.time_s is not None), default=0)

    @property
    def train_time_s(self) -> float:
        """Wall time of every process that trained this run (resumes included): the span epochs_done covers."""
        open_part = 0.0 if self._part_t0 is None or self.last_t is None else max(self.last_t - self._part_t0, 0.0)
        return self.trained_s + open_part

    @property
    def best(self) -> EpochRow | None:
        # (fitness, row) of every validated epoch: max() keeps the first row of equal fitness
        weights = self.task.fitness_weights
        scored = [(self.task.fitness(r.metrics), r) for r in self.rows.values() if weights.keys() <= r.metrics.keys()]
        return max(scored, key=lambda p: p[0], default=(0.0, None))[1]

    @property
    def labels(self) -> tuple[str, ...]:
        """The metrics' column headings (P, R, mAP50, mAP50-95; top1, top5)."""
        return tuple(self.task.label(m) for m in self.metrics)

    @property
    def fallback(self) -> dict[str, Any] | None:
        """The current process's last `graph` fallback or step-down, if any: it trains eager (fallback) or with the
        network graph (step_down, from the whole step) from that step on. (A fallback written before run_start is
        the mode choice itself, which run_start already reports.)"""
        since = (self.start or {}).get("t", float("-inf"))
        return next(
            (
                g
                for g in reversed(self.graphs)
                if g.get("action") in ("fallback", "step_down") and g.get("t", since) >= since
            ),
            None,
        )

    @property
    def fraction(self) -> float:
        """Share of the whole schedule trained (a resumed run counts what earlier processes did)."""
        if not self.epochs:
            return 0.0
        return min(1.0, (self.epoch + self.step / max(self.steps, 1)) / self.epochs)
