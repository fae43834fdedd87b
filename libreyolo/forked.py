"""Kept child processes for work that would otherwise hold the interpreter lock beside the training loop: the COCO
evaluation (eval/coco.py) and the run's pictures (plots/writer.py). Forked, not spawned: a child starts in
milliseconds with what this process imported, and spawn would re-import the caller's script. A child runs numpy,
OpenCV, matplotlib or faster-coco-eval, never CUDA."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

PARENT_CHECK_S = 0.5  # how often a child looks whether its parent still lives


def forked_pool(workers: int, init: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A pool of `workers` forked children, each ending itself once this process is gone (_end_with); init, if
    given, runs first in each child."""
    fork = multiprocessing.get_context("fork")
    return ProcessPoolExecutor(workers, fork, initializer=_end_with, initargs=(os.getpid(), init))


def can_fork() -> bool:
    """fork is only safe on Linux here (macOS' system libraries may crash in a forked child; Windows has none)."""
    return "fork" in multiprocessing.get_all_start_methods() and os.uname().sysname == "Linux"


def _end_with(parent: int, init: Callable[[], None] | None = None) -> None:
    """A child's initializer: a thread that ends the process once `parent` is gone. An executor's worker waits for
    work without a timeout and only its parent's executor tells it to stop: a parent that died without shutting it
    down would leave it waiting forever, holding the parent's stdout (a shell's `| tail` would never return). Not
    PR_SET_PDEATHSIG: that fires when the forking thread ends, and the fork may come from a validation thread."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="libreyolo-parent-watch", daemon=True).start()
    if init is not None:
        init()
