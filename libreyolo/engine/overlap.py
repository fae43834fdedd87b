"""A micro-step's backward on a thread of its own, so that the next micro-step's forward runs beside it.

The eager step on a GPU is host-bound: on the H200, LibreYOLO9t at batch 8 spent ~50 ms of host time in the
forward and loss on the loop's thread, then ~45 ms in the backward, which autograd runs on its device thread while
the loop's thread waits (docs/performance.md). Inside an accumulation window the weights do not change, so the
next micro-step's forward needs nothing from this one's backward: the backward is started from a helper thread and
the loop goes on to the next batch. What stays ordered:
- each backward starts after the previous one has ended and handed its gradients on (start() waits first), so
  gradients accumulate in the same order;
- the helper runs on the caller's device and stream, so the GPU runs the same kernels on the same stream;
- an error in the backward is raised by the next wait() (the next micro-step, the boundary step, or sync()).
Two micro-steps' activations are alive at once while they overlap, so the peak memory grows: the setup turns this
on only where it helps and the batch was not sized to the memory (engine/components.py: overlap_wanted)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch


class PendingBackward:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, backward: Callable[[], None]) -> None:
        """Waits for the previous backward, then runs backward() on a helper thread, on this thread's CUDA device
        and stream."""
        self.wait()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        device = torch.cuda.current_device() if cuda else None
        stream = torch.cuda.current_stream() if cuda else None

        def run() -> None:
            try:
                if device is not None and stream is not None:
                    with torch.cuda.device(device), torch.cuda.stream(stream):
                        backward()
                else:
                    backward()
            except BaseException as e:  # noqa: BLE001  (raised on the caller's thread by wait())
                self._error = e

        self._thread = threading.Thread(target=run, name="libreyolo-backward", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the backward started last has ended; raises what it raised."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
