"""Ctrl-C and SIGTERM while the epochs run: stop at the next optimizer-step boundary, not inside a step.

A KeyboardInterrupt raised wherever the signal lands can stop the network halfway through a forward: the BatchNorm
layers it has passed have updated their running statistics for a step that never finishes, and last.pt keeps
them. A resume from there is not the run that was interrupted. So while the loop runs, the first SIGINT or SIGTERM
only asks it to stop; the loop stops once the step in flight has finished its optimizer step (an accumulation
boundary), where its weights, BatchNorm statistics, optimizer, EMA and random generators are a state the
uninterrupted run passed through, and last.pt is saved there. A second signal raises KeyboardInterrupt at once.

Only a signal that would raise KeyboardInterrupt anyway is taken over: SIGINT with Python's default handler, and
SIGTERM where the caller installed `raise_interrupt` (the CLI does; a Python program's SIGTERM is its own). Signal
handlers can only be set from the main thread; elsewhere nothing changes, and neither under DDP, where every rank
would have to stop at the same boundary (the launcher stops its workers, libreyolo/launch.py)."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler that takes Ctrl-C's path: save last.pt, write run_end "interrupted", exit."""
    raise KeyboardInterrupt


class StopSignals:
    """A context over the epochs: `requested` names the first signal received (SIGINT, SIGTERM), None before."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested: str | None = None
        self._saved: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt  # asked twice: now
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return self
        ours = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: raise_interrupt}
        for sig, raising in ours.items():
            if signal.getsignal(sig) is raising:
                self._saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
