"""When a training run lets Python's garbage collector walk the heap.

A full (generation 2) collection walks every tracked object while holding the interpreter lock. In the 800-image
race on the H200 machine (~270,000 objects in the heap) one took 57-119 ms and one ran every 3-5 s: four during the
start (while torch is imported and the run set up, 0.31 s together), then through the epochs in whichever thread
allocated (the checkpoint writer's pickling, the validation's results, the loop). The training loop, which needs the
lock to queue each step, waited meanwhile: after an epoch's seam a trace saw the GPU idle for 101 ms
beside a 68 ms collection in the checkpoint writer's thread (docs/performance-archive.md, 2026-12-03).

So a run holds automatic collections through its start (held_collections; the `libreyolo train` command from its
first import on) and runs its epochs on a frozen heap (gc.freeze): what existed then is never walked again, and the
collections of what the epochs allocate (5,000-26,000 objects) took 2.6-5.9 ms. The start's cyclic garbage (a few
hundred objects) is freed after the run, when the heap is unfrozen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_collections() -> Iterator[None]:
    """No automatic collections for the duration, then as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap and collect automatically for the duration; then unfreeze what this froze (a caller that
    froze its heap itself keeps it frozen) and collect automatically or not, as before."""
    enabled, frozen_before = gc.isenabled(), gc.get_freeze_count()
    gc.freeze()
    gc.enable()
    try:
        yield
    finally:
        if frozen_before == 0:
            gc.unfreeze()
        if not enabled:
            gc.disable()
