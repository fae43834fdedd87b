"""What may attach to a running loop (an `on_start` callable, such as the profiler's window) sees of it: a
protocol, so the profiler, which sits above the engine, is typed without the trainer's whole surface."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from libreyolo import events as ev
from libreyolo.config import TrainConfig
from libreyolo.engine.checkpoint import CheckpointWriter
from libreyolo.engine.setup import TrainSetup
from libreyolo.engine.step import Phases


class RunLoop(Protocol):
    """The phases each step is timed under and the callable after every step (both swapped in and back by the
    attachment), where the loop is, its events, its checkpoint writer (drained before measuring), and a stop
    request (the loop ends after the current step)."""

    cfg: TrainConfig
    epoch: int
    step_in_epoch: int
    phases: Phases
    after_step: Callable[[RunLoop], None] | None
    stop_requested: str | None
    writer: CheckpointWriter

    @property
    def s(self) -> TrainSetup: ...

    def emit(self, event: ev.Event) -> None: ...


OnStart = Callable[[RunLoop], object]  # its result is not used
