"""The profiled window: discard `profile_warmup` real steps, then as many as the training loader can hold ready
ahead (profiler/prefetch.py), then measure `profile_steps` in two halves.

The second discard is what makes the first half's data wait honest: the setup and the warmup's slow steps let the
loader's workers fill their queue, and a step served from that queue waits for nothing however slow the loader is.
After those steps every measured batch was requested from the loader after the warmup ended (and after any CUDA
graph capture, whose long step lets the queue refill too). Requested then, but not necessarily made at the loader's
own pace: while those steps consumed the full queue faster than a slow loader refills it, its workers went on
making batches, and the first half would be served from them (one worker at 274 ms a batch and a 109 ms step leave
about 3 of 7). So the window goes on discarding until a step has waited for its batch (the queue has run dry), or
for as many steps again, where the loader keeps ahead of the step and its queue serves training the same way.

First half: no added synchronisation, under torch.profiler, so data loading, host work and GPU work overlap as
they really do; only this half decides the verdict. Second half: every phase is bracketed with a device
synchronize, so its time can be attributed to phases (reported, never used for the verdict). Then the window
writes its artifacts, emits a `profile` event and hands the loop back exactly as it found it.

A step in which the step runner captured (or re-captured) a CUDA graph is never measured: capture runs the
step's work several times, empties the allocator cache and allocates the graph's pool, which would read as a
slow step with allocator churn. In the first half the window starts again after it (with a fresh profiler, at the
first accumulation boundary once the loader's queue has been consumed again); in the second half that step is left
out and the half goes on. The steps moved past are in `Window.moved` and in the report.

The window lives on the trainer only while it measures: `trainer.phases` and `trainer.after_step` are swapped
in and restored, so a run with profile off carries nothing on its hot path."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from libreyolo import events as ev
from libreyolo.engine.loop import RunLoop
from libreyolo.engine.step import PHASES
from libreyolo.profiler.prefetch import cache_fill, loader_queue, waited_for_batch

ANNOTATION = "libreyolo::"  # prefix of the record_function ranges the analysis looks for in the trace
WARMUP, UNSYNC, SYNC, DONE = "warmup", "unsync", "sync", "done"
# a run that captures again and again (shapes that keep changing) is measured anyway after this many moves;
# the trace's capture count then says that the window holds captures
MAX_MOVES = 8


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None  # CPU work is done when the call returns: wall time is the truth


@dataclass
class Plan:
    """Requested sizes; the halves end only at accumulation boundaries, so each holds whole optimizer cycles."""

    warmup: int
    unsync: int
    sync: int

    @classmethod
    def from_config(cls, warmup: int, steps: int) -> Plan:
        first = math.ceil(steps / 2)
        return cls(warmup, first, max(steps - first, 1))


@dataclass
class HalfRecord:
    steps: int = 0
    images: int = 0
    step_s: list[float] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wall_s: float = 0.0  # sum of segment spans (unsync half: from a step's data wait to the closing sync)
    segments: int = 0


class _Phase:
    """One phase entry; times it and, in the first half, marks it in the trace."""

    __slots__ = ("w", "name", "t0", "rf")

    def __init__(self, window: Window, name: str):
        self.w, self.name, self.rf = window, name, None

    def __enter__(self) -> _Phase:
        w = self.w
        if self.name == "data":
            if w.epoch_end_work:
                # the epoch that ended inside the window left its checkpoint write in a background thread:
                # finish it before this step's clock starts, so the step is measured without it
                w.epoch_end_work = False
                w.trainer.writer.drain(wait=True)
            w.begin_step()
        if w.state == SYNC:
            w.sync()
        elif w.state == UNSYNC:
            self.rf = record_function(ANNOTATION + self.name)
            self.rf.__enter__()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> bool:
        w = self.w
        if w.state == SYNC:
            w.sync()
        dt = time.perf_counter() - self.t0
        if self.rf is not None:
            self.rf.__exit__(*exc)
        if w.step_open:
            w.current[self.name] = w.current.get(self.name, 0.0) + dt
        return False


class Recorder:
    """What `trainer.phases` is during the measured halves."""

    def __init__(self, window: Window):
        self.window = window

    def __call__(self, name: str) -> Any:
        return _Phase(self.window, name)


class Window:
    """Attached by `libreyolo.profiler.attach`; drives itself from `trainer.after_step`."""

    def __init__(self, trainer: RunLoop, plan: Plan, on_done: Callable[[Window], None]):
        self.trainer, self.plan, self.on_done = trainer, plan, on_done
        s = trainer.s
        self.device: torch.device = s.device
        self.sync = synchronizer(self.device)
        self.state = WARMUP
        self.seen = 0  # steps since attach
        self.warmup_steps = 0  # steps discarded before the first half: warmup, the loader's queue, captures
        # the batches the training loader can hold ready: discarded after the warmup (and after a capture) so that
        # the first half is not served from a queue filled during slow steps
        self.queue = loader_queue(getattr(s, "train_loader", None))
        self.start_after = plan.warmup + self.queue.batches  # steps since attach before the first half may start
        # after start_after: steps discarded until one waited for its batch (the queue ran dry), at most
        # queue.batches of them; drain_waited says which ended it, drain_waits_ms what each waited
        self.drain_waited = False
        self.drain_waits_ms: list[float] = []
        self.cache_fill: list[tuple[int, int] | None] = []  # the image cache being filled, at the window's ends
        self.unsync, self.synced = HalfRecord(), HalfRecord()
        self.prof: profile | None = None
        self.current: dict[str, float] = {}
        self.step_open = False
        self.epoch_end_work = False  # an epoch ended inside the window: its end work is settled before the next step
        self._t_step = 0.0
        self._rf_step: Any = None
        self._rf_segment: Any = None
        self._t_segment: float | None = None
        self._last_key = (trainer.epoch, trainer.step_in_epoch)
        self._prev_phases, self._prev_after = trainer.phases, trainer.after_step
        self.mem_before: dict[str, int] = {}
        self.mem_after: dict[str, int] = {}
        self.peak_allocated = self.peak_reserved = 0
        self.moved: list[int] = []  # steps (counted from attach, 1-based) held a CUDA graph capture: not measured
        self._captures = self._capture_count()
        trainer.after_step = self
        if self.start_after == 0:  # the loop starts on an accumulation boundary: measure from its first step
            self._start_unsync()

    # --- boundaries ---------------------------------------------------------------------------------
    def _boundary(self) -> tuple[bool, bool]:
        """(accumulation boundary, epoch's last step) for the step that just ended.

        The trainer moves step_in_epoch forward only when an optimizer step ran (an accumulation boundary,
        always including an epoch's last step), so a change of (epoch, step_in_epoch) marks a boundary."""
        tr = self.trainer
        key = (tr.epoch, tr.step_in_epoch)
        boundary = key != self._last_key and tr.step_in_epoch > 0
        self._last_key = key
        return boundary, boundary and tr.step_in_epoch == tr.s.sampler.batches_per_epoch()

    def _images(self, epoch_end: bool) -> int:
        s = self.trainer.s
        if epoch_end:  # the last batch of an epoch holds what is left over
            nb = s.sampler.batches_per_epoch()
            return s.sampler.sampler.num_samples - (nb - 1) * s.batch_per_rank
        return s.batch_per_rank

    # --- steps --------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        if self.state == UNSYNC:
            if self._rf_step is not None:  # a data wait that never became a step: drop it
                self._rf_step.__exit__(None, None, None)
            if self._t_segment is None:
                self._t_segment = time.perf_counter()
                self._rf_segment = record_function(ANNOTATION + "segment")
                self._rf_segment.__enter__()
            self._rf_step = record_function(ANNOTATION + "step")
            self._rf_step.__enter__()
        elif self.state == SYNC:
            self.sync()
        self.current = {}
        self.step_open = True
        self._t_step = time.perf_counter()

    def _end_step(self, half: HalfRecord, images: int) -> None:
        half.step_s.append(time.perf_counter() - self._t_step)
        for k, v in self.current.items():
            half.phase_s[k] = half.phase_s.get(k, 0.0) + v
        half.steps += 1
        half.images += images
        self.step_open = False
        if self._rf_step is not None:
            self._rf_step.__exit__(None, None, None)
            self._rf_step = None

    def _close_segment(self) -> None:
        """Wait for the queued GPU work, so the segment's wall time covers all the work its steps launched."""
        self.sync()
        if self._t_segment is not None:
            self.unsync.wall_s += time.perf_counter() - self._t_segment
            self.unsync.segments += 1
            self._t_segment = None
        if self._rf_segment is not None:
            self._rf_segment.__exit__(None, None, None)
            self._rf_segment = None
        self._read_peak()  # the trainer resets peak memory stats at every epoch end

    # --- the hook -----------------------------------------------------------------------------------
    def __call__(self, trainer: RunLoop) -> None:
        if self._prev_after is not None:
            self._prev_after(trainer)
        self.seen += 1
        boundary, epoch_end = self._boundary()
        captures = self._capture_count()
        captured, self._captures = captures > self._captures, captures
        if captured and self.state in (UNSYNC, SYNC) and len(self.moved) < MAX_MOVES:
            self._move_past_capture(boundary)
        elif self.state == WARMUP:
            self.warmup_steps += 1
            if captured:  # a capture's long step lets the loader's queue refill: consume it before measuring
                self._discard_queue(max(self.start_after, self.seen + self.queue.batches))
            self._time_drain()
            if boundary and self._drained():
                self._start_unsync()
        elif self.state == UNSYNC:
            self._end_step(self.unsync, self._images(epoch_end))
            done = self.unsync.steps >= self.plan.unsync and boundary
            if epoch_end or done:
                self._close_segment()
            if done:
                self._stop_profiler()
                self.state = SYNC
        elif self.state == SYNC:
            self._end_step(self.synced, self._images(epoch_end))
            if self.synced.steps >= self.plan.sync and boundary:
                self.state = DONE
                self.detach()
                self.on_done(self)
        # only while the recorder is in place: an epoch that ends in the warmup leaves nothing to settle
        self.epoch_end_work = epoch_end and self.state in (UNSYNC, SYNC)

    def _discard_queue(self, start_after: int) -> None:
        """Discard until start_after steps since attach (the loader's queue, refilled), then drain anew: the
        drain's timing, if it had begun, is dropped until then."""
        self.start_after = start_after
        self.drain_waited = False
        self.drain_waits_ms = []
        self.trainer.phases = self._prev_phases

    def _time_drain(self) -> None:
        """For a discarded step after start_after: count it in the drain and note whether it waited for its batch.
        The step at start_after puts the Recorder in place, so the data phase of the steps after it is timed."""
        if self.warmup_steps < self.start_after or not self.queue.batches or self.drain_waited:
            return
        if isinstance(self.trainer.phases, Recorder) and "data" in self.current:
            self.drain_waited = waited_for_batch(self.current["data"], time.perf_counter() - self._t_step)
            self.drain_waits_ms.append(round(self.current["data"] * 1000, 2))
        else:
            self.trainer.phases = Recorder(self)
            self.current = {}

    @property
    def drain_steps(self) -> int:
        return len(self.drain_waits_ms)

    def _drained(self) -> bool:
        """The discarded warmup and queue are behind (start_after), and since then a step has waited for its batch
        (the queue ran dry) or queue.batches steps have gone by without one waiting."""
        if self.warmup_steps < self.start_after:
            return False
        return not self.queue.batches or self.drain_waited or self.drain_steps >= self.queue.batches

    def _capture_count(self) -> int:
        """CUDA graphs the step runner has captured so far (the eager step never captures)."""
        return int(getattr(self.trainer.s.step, "captures", 0))

    def _move_past_capture(self, boundary: bool) -> None:
        """The step that just ended held a capture: leave it out of the window."""
        self.moved.append(self.seen)
        self.step_open = False
        if self.state == SYNC:
            return  # the verdict's half is already measured; this step's phase times include the capture: not counted
        # first half: everything measured so far goes, with its profiler; measuring starts again after this step
        for rf in (self._rf_step, self._rf_segment):
            if rf is not None:
                rf.__exit__(None, None, None)
        self._rf_step = self._rf_segment = None
        self._t_segment = None
        self.sync()  # the capture's queued work must not run inside the new window
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.prof = None
        self.unsync = HalfRecord()
        self.peak_allocated = self.peak_reserved = 0
        self.warmup_steps = self.seen  # every step so far is outside the window
        self._discard_queue(self.seen + self.queue.batches)  # the queue refilled during the capture: consume it again
        self.state = WARMUP
        if boundary and self._drained():
            self._start_unsync()

    def _start_unsync(self) -> None:
        self.sync()  # the warmup's queued GPU work must not run inside the window
        self.trainer.writer.drain(wait=True)  # nor a checkpoint write of an epoch that ended in the warmup
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.mem_before = dict(torch.cuda.memory_stats(self.device))
        self.cache_fill = [cache_fill(getattr(self.trainer.s, "train_loader", None))]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.prof = profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False)
        self.prof.__enter__()
        self.state = UNSYNC
        self.trainer.phases = Recorder(self)

    def _stop_profiler(self) -> None:
        if self.device.type == "cuda":
            self.mem_after = dict(torch.cuda.memory_stats(self.device))
        self.cache_fill.append(cache_fill(getattr(self.trainer.s, "train_loader", None)))
        if self.prof is not None:
            self.prof.__exit__(None, None, None)

    def _read_peak(self) -> None:
        if self.device.type == "cuda":
            self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated(self.device))
            self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved(self.device))

    # --- handing back -------------------------------------------------------------------------------
    def detach(self) -> None:
        """Put the loop back as it was; safe to call twice."""
        tr = self.trainer
        if tr.after_step is self:
            tr.after_step = self._prev_after
        if isinstance(tr.phases, Recorder) and tr.phases.window is self:
            tr.phases = self._prev_phases
        closers = tr.s.closers
        if self.close in closers:
            closers.remove(self.close)

    def close(self) -> None:
        """Run end before the window finished (short run, Ctrl-C, an error): stop the profiler, say so."""
        if self.state == DONE:
            return
        for rf in (self._rf_step, self._rf_segment):
            if rf is not None:
                rf.__exit__(None, None, None)
        self._rf_step = self._rf_segment = None
        if self.state == UNSYNC:
            self._stop_profiler()
        needed = self.plan.warmup + self.queue.batches + self.plan.unsync + self.plan.sync
        state, self.state = self.state, DONE
        self.detach()
        moved = f"; it moved past CUDA graph captures at step(s) {_steps(self.moved)}" if self.moved else ""
        queue = f", then the loader's {self.queue.describe()}" if self.queue.batches else ""
        self.trainer.emit(
            ev.WarningEvent(
                f"profile: training ended after {self.seen} step(s), in the {state} part of the window "
                f"(needs at least {needed}{moved}: profile_warmup={self.plan.warmup}{queue}, "
                f"profile_steps={self.plan.unsync + self.plan.sync}); "
                "no report written. Train for more steps or lower profile_warmup / profile_steps.",
                code="profile",
            )
        )

    def figures(self) -> dict[str, Any]:
        """Wall-clock figures of both halves (ms per step), for the analysis."""
        u, s = self.unsync, self.synced
        step_ms = 1000 * u.wall_s / max(u.steps, 1)
        data_ms = 1000 * u.phase_s.get("data", 0.0) / max(u.steps, 1)
        return {
            "step_ms": step_ms,
            "data_ms": data_ms,
            "data_frac": data_ms / step_ms if step_ms > 0 else 0.0,
            "img_s": u.images / u.wall_s if u.wall_s > 0 else 0.0,
            "host_ms": {k: 1000 * v / max(u.steps, 1) for k, v in u.phase_s.items()},
            "synced_ms": {k: 1000 * v / max(s.steps, 1) for k, v in s.phase_s.items()},
            "synced_step_ms": 1000 * sum(s.step_s) / max(s.steps, 1),
        }


def _steps(steps: list[int]) -> str:
    return ", ".join(str(k) for k in steps)
