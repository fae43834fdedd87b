"""A whole validation (device part and COCO evaluation) on a thread of its own, with its own CUDA stream.

Inside training on a GPU the validated weights are a copy (engine/epochval.py), so the next epoch's steps can
run on the training stream while the validation's forward, loss and NMS run on this one: the training loop is
not held for them. The thread's host synchronisations (NMS output sizes, the per-batch device-to-host copy)
wait for its own stream only, and a graph replay on the training thread releases the interpreter lock, so the
two threads mostly take turns on the host while both streams keep the GPU busy."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from libreyolo.eval.validator import PendingValidation


class ThreadedValidation:
    """`run()` (a `start_validation(..., background=False)` call) and then its COCO evaluation, on a thread whose
    current stream is `stream` (if given); the stream first waits for `ready` (the weights copy on the training
    stream).
    done() / result() as PendingValidation's; wait_device() returns once the device part has finished."""

    def __init__(
        self,
        run: Callable[[], PendingValidation],
        stream: torch.cuda.Stream | None = None,
        ready: torch.cuda.Event | None = None,
    ):
        self._run, self._stream, self._ready = run, stream, ready
        self._pending: PendingValidation | None = None
        self._error: BaseException | None = None
        self._device_done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="libreyolo-val", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            if self._stream is None:
                self._pending = self._run()
            else:
                with torch.cuda.stream(self._stream):
                    if self._ready is not None:
                        self._stream.wait_event(self._ready)
                    self._pending = self._run()
        except BaseException as e:  # handed to whoever asks for the result
            self._error = e
        finally:
            self._device_done.set()
        if self._pending is not None:
            try:
                self._pending.result()  # the COCO evaluation, in this thread; kept for the caller's result()
            except BaseException:
                pass  # result() raises it again in the caller's thread

    def wait_device(self) -> None:
        """Until the forward, loss and NMS are done (the validation loader and graph are free again)."""
        self._device_done.wait()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> dict[str, Any]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._pending is not None
        return self._pending.result()
