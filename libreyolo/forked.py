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
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

PARENT_CHECK_S = 0.5  # how often a child looks whether its parent still lives
T = TypeVar("T")


class KeptChild:
    """Child processes (`workers` of them, forked together by start() or the first call and kept for the next ones)
    in which `call(fn, *args)` runs fn (the caller's thread waits without the interpreter lock; calls from several
    threads run side by side, up to `workers` at once). A child that died is not restarted: that call and the later
    ones run in the caller's process, as without children. close() ends them; a parent that ends without close()
    (killed, or a crash's os._exit) leaves each to end itself within PARENT_CHECK_S. init, if given, runs first in
    each child."""

    def __init__(self, init: Callable[[], None] | None = None, workers: int = 1) -> None:
        self._init, self._workers = init, workers
        self._pool: ProcessPoolExecutor | None = None
        self._broken = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Fork the children now (each fork holds the interpreter lock while the kernel copies this process's page
        tables: 24 ms on the CPU machine), rather than beside the steps at the first call. A fork-context executor
        forks all its workers at its first submission."""
        self._get_pool()

    def _get_pool(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and not self._broken:
                self._pool = forked_pool(self._workers, self._init)
                self._pool.submit(int)  # the executor forks its worker at the first submission
            return self._pool

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        pool = self._get_pool()
        if pool is not None:
            try:
                return pool.submit(fn, *args).result()
            except BrokenProcessPool:
                with self._lock:
                    self._broken, self._pool = True, None
        return fn(*args)

    def close(self, wait: bool = True) -> None:
        """wait=False: a call still running is left to the child, which ends once it has returned."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)


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
