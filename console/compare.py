"""The compare view's model: several runs side by side, folded from their event streams, without Textual.

Each run is a RunState (the run view's own fold) plus what a comparison needs beyond one run: the run's
arguments as first given (the first run_start's `config`, or args.yaml), its wall time summed over the
processes that trained it (a resumed run is several), and its state word as the run list derives it.

Loss terms differ by family (YOLOv9 box/cls/dfl, YOLOX iou/obj/cls/l1), so the loss curves overlay either
each run's total (the sum of its own terms) or one term every compared run has by name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from libreyolo_console.runs import classify, process_alive
from libreyolo_console.state import RunState
from libreyolo_console.supervisor import read_record
from libreyolo_console.tail import EventBatch, EventTail

ARGS_YAML = "args.yaml"
TOTAL = "total"
# Bookkeeping keys that differ between any two runs without saying anything about them.
IGNORED_KEYS = frozenset({"name", "exist_ok", "resume"})

Curve = tuple[list[float], list[float]]


@dataclass
class CompareRun:
    run_dir: Path
    name: str
    status: str = "?"  # "?" until the first read of its events.jsonl; then live, crashed or run_end's status
    state: RunState = field(default_factory=RunState)
    first_start: dict[str, Any] | None = None  # run_start of the first process (the args as first given)
    file_args: dict[str, Any] = field(init=False, default_factory=dict)  # args.yaml, for a run_start without config
    loaded: bool = False
    _parts_s: float = 0.0  # wall time of the processes that have ended (or were followed by another)
    _open_t: float | None = None  # run_start time of the process not yet ended
    _last_t: float | None = None  # time of the newest event

    def __post_init__(self) -> None:
        self.file_args = read_args_yaml(self.run_dir)

    # --- folding events ---------------------------------------------------------------------------------
    def apply(self, events: list[dict[str, Any]], reset: bool = False) -> None:
        """Events appended to the run's events.jsonl; `reset` when the file started over (rebuild)."""
        if reset:
            self.state, self.first_start = RunState(), None
            self._parts_s, self._open_t, self._last_t = 0.0, None, None
        self.loaded = True
        self.state.apply(events)
        for e in events:
            t = e.get("t")
            if not isinstance(t, (int, float)):
                continue
            kind = e.get("type")
            if kind == "run_start":
                if self.first_start is None:
                    self.first_start = e
                self._close(self._last_t)  # a process without run_end (crashed) ran until its last event
                self._open_t = float(t)
            elif kind == "run_end":
                took = e.get("time_s")
                self._close(float(t), float(took) if isinstance(took, (int, float)) else None)
            self._last_t = float(t)

    def _close(self, t: float | None, took: float | None = None) -> None:
        if self._open_t is None:
            return
        if took is None:
            took = max(0.0, (t if t is not None else self._open_t) - self._open_t)
        self._parts_s += took
        self._open_t = None

    # --- what the table shows ---------------------------------------------------------------------------
    @property
    def wall_s(self) -> float | None:
        """Seconds trained, summed over the run's processes: run_end.time_s of each one that ended, from
        run_start to its last event for one that crashed or still runs. The gaps between them are left out."""
        if self.first_start is None:
            return None
        running = 0.0
        if self._open_t is not None and self._last_t is not None:
            running = max(0.0, self._last_t - self._open_t)
        return self._parts_s + running

    @property
    def best_map(self) -> float | None:
        """mAP50-95 of the best epoch (best fitness, the one best.pt holds), as the run view shows it; for another
        task its headline metric (a classifier's top1; best_label names it)."""
        best = self.state.best
        return None if best is None else best.metrics.get(self.state.task.headline)

    @property
    def best_label(self) -> str:
        """ "" for detection (the column says mAP50-95), else the headline metric's name."""
        task = self.state.task
        return "" if task.name == "detect" else task.label(task.headline)

    @property
    def epoch_text(self) -> str:
        s = self.state
        return f"{s.epochs_done}/{s.epochs}" if s.epochs else "-"

    @property
    def img_s(self) -> float | None:
        """Training images/s of the last completed epoch; before one completed, of the last step event."""
        done = [r for _, r in sorted(self.state.rows.items()) if r.img_s is not None]
        if done:
            return done[-1].img_s
        step = self.state.last_step
        return float(step["img_s"]) if step is not None and "img_s" in step else None

    @property
    def gpu(self) -> str:
        """The GPU's name where run_start records one, else the device (`cuda:0`, `cpu`), with `xN` for DDP."""
        st = self.state.start
        if st is None:
            return "-"
        name = st.get("gpu_name") or st.get("gpu") or st.get("device") or "-"
        world = st.get("world_size", 1)
        return f"{name} x{world}" if isinstance(world, int) and world > 1 else str(name)

    @property
    def args(self) -> dict[str, Any]:
        config = (self.first_start or {}).get("config")
        return config if isinstance(config, dict) and config else self.file_args

    @property
    def terms(self) -> tuple[str, ...]:
        return self.state.terms

    # --- curves -----------------------------------------------------------------------------------------
    def loss_curve(self, choice: str = TOTAL) -> Curve:
        """(fractional epoch, loss) per step event: the sum of the run's terms, or one term by name. A point
        that lacks any of them is left out."""
        terms = self.terms if choice == TOTAL else (choice,)
        xs: list[float] = []
        ys: list[float] = []
        for x, lo in self.state.losses:
            if terms and all(t in lo for t in terms):
                xs.append(x)
                ys.append(sum(lo[t] for t in terms))
        return xs, ys

    def map_curve(self) -> Curve:
        """(epoch, mAP50-95) per validated epoch, epochs counted from 1."""
        xs: list[float] = []
        ys: list[float] = []
        for _, r in sorted(self.state.rows.items()):
            if r.map is not None:
                xs.append(float(r.epoch + 1))
                ys.append(float(r.map))
        return xs, ys

    # --- the process ------------------------------------------------------------------------------------
    def check_status(self) -> str:
        """live, crashed or run_end's status, as the run list says it (runs.classify); "?" until loaded."""
        if self.loaded:
            rec = read_record(self.run_dir)
            start, end = self.state.start, self.state.end
            self.status = classify(start, end, rec, process_alive(rec, start))
        return self.status


def read_args_yaml(run_dir: Path) -> dict[str, Any]:
    """The run's args.yaml (the trainer writes every TrainConfig key there), or {} without a readable one."""
    try:
        raw = yaml.safe_load((run_dir / ARGS_YAML).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, dict) else {}


_MISSING = object()


def differing_keys(runs: list[CompareRun]) -> list[str]:
    """The argument keys whose values are not the same in every run (a key one run lacks counts as
    differing), in the order they first appear; bookkeeping keys (name, exist_ok, resume) left out."""
    if len(runs) < 2:
        return []
    keys: dict[str, None] = {}
    for r in runs:
        keys.update(dict.fromkeys(r.args))
    out = []
    for k in keys:
        if k in IGNORED_KEYS:
            continue
        values = [r.args.get(k, _MISSING) for r in runs]
        if any(v != values[0] for v in values[1:]):
            out.append(k)
    return out


def arg_text(run: CompareRun, key: str) -> str:
    v = run.args.get(key, _MISSING)
    if v is _MISSING:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def loss_choices(runs: list[CompareRun]) -> list[str]:
    """What the loss plot can overlay: the total, then each term every run has (in the first run's order)."""
    shared = [t for t in (runs[0].terms if runs else ()) if all(t in r.terms for r in runs[1:])]
    return [TOTAL, *shared]


def loss_note(runs: list[CompareRun], choice: str) -> str:
    """One line saying what the loss curves are."""
    if choice == TOTAL:
        sums = list(dict.fromkeys("+".join(r.terms) for r in runs if r.terms))
        what = f"loss: each run's total ({'; '.join(sums)})" if sums else "loss: each run's total"
    else:
        what = f"loss: {choice} (a term every run has)"
    others = [c for c in loss_choices(runs) if c != choice]
    return what + (f" · l: {', '.join(others)}" if others else "")


def follow_all(
    tails: list[EventTail],
    deliver: Callable[[int, EventBatch], object],
    stop: threading.Event,
    interval: float = 0.5,
) -> None:
    """Poll every run's events.jsonl tail in turn from one thread until `stop` is set, handing each non-empty
    batch to `deliver(index, batch)`. Each file's first read is delivered even when empty: that run is then
    known to have no events yet (rather than not read yet). Appended lines only are read after that."""
    first = True
    while not stop.is_set():
        more = False
        for i, tail in enumerate(tails):
            batch = tail.read()
            if batch or first:
                deliver(i, batch)
            more = more or batch.more
        first = False
        if not more:
            stop.wait(interval)
