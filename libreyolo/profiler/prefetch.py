"""How many batches the training loader can hold ready ahead of the step: the window discards that many steps
after its warmup before it measures.

A loader slower than the step still shows no data wait while the step is served from batches prepared earlier,
and the warmup's slow steps (cuDNN autotuning, first-use allocations, graph captures) and the setup let the queue
fill up. The batches that can be ready ahead are deterministic:

- a torch DataLoader with W workers keeps W x prefetch_factor batch indices outstanding and sends the next one
  only when a batch is handed out (data/loader.py sets prefetch_factor: 4 below 4 workers, 2 from 4 on);
- on CUDA, data/staging.PinnedStager's thread takes batches from that loader into SLOTS page-locked slots: the
  caller holds one, the other SLOTS - 1 may be staged ahead (with workers=0 too: the thread then loads them).

So batch k of a pass is requested from the loader no earlier than when the step took batch k - Q (Q the sum of
both). Discarding Q steps after the warmup makes every measured batch one that was requested after the warmup;
profiler/window.py then discards until a step waits for its batch, for what a slow loader made while those Q steps
consumed the full queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo.data.staging import SLOTS
from libreyolo.profiler.verdict import DATA_FRAC

# a step waited for the loader (its queue had run dry) when its batch took at least WAITED_S and WAITED_SHARE of the
# step to arrive. Taking a batch that is ready takes well under a millisecond (a queue's get), yet a wait over 2 ms
# once ended the drain of an H100's one-worker case with the workers' queue still full (its first half then waited
# 1%; docs/performance.md). What held that batch back was not measured; one candidate is the staging thread waiting
# for the interpreter lock, which an eager host-bound step hands over every 5 ms. A dry queue makes the step wait
# what the loader is behind, which for a dataloader verdict (DATA_FRAC of the step) is twice WAITED_SHARE or more.
WAITED_S = 0.002
WAITED_SHARE = DATA_FRAC / 2


def waited_for_batch(data_s: float, step_s: float) -> bool:
    """A step of step_s seconds whose batch took data_s to arrive waited for the loader's queue to refill."""
    return data_s >= max(WAITED_S, WAITED_SHARE * step_s)


@dataclass(frozen=True)
class LoaderQueue:
    workers: int
    per_worker: int  # the loader's prefetch_factor (0 without workers)
    staged: int  # batches the staging thread can hold ready beyond the one the step is using

    @property
    def batches(self) -> int:
        return self.workers * self.per_worker + self.staged

    def describe(self) -> str:
        """'8 prefetched batches (2 workers x 4)', '33 prefetched batches (15 workers x 2 + 3 staged)', or
        'no prefetched batches'."""
        if not self.batches:
            return "no prefetched batches"
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        parts = [f"{workers} x {self.per_worker}"] if self.workers else []
        if self.staged:
            parts.append(f"{self.staged} staged")
        return f"{self.batches} prefetched batches ({' + '.join(parts)})"


def loader_queue(loader: Any) -> LoaderQueue:
    """The queue of the run's training loader (data/loader.TrainLoader); an empty one for anything else (no loader,
    a plain iterable): then nothing is discarded for it."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    per_worker = int(getattr(loader, "prefetch_factor", None) or 0) if workers > 0 else 0
    # TrainLoader stages through PinnedStager (default slots) exactly when stage_to is a CUDA device
    staged = SLOTS - 1 if getattr(loader, "stage_to", None) is not None else 0
    return LoaderQueue(workers if per_worker else 0, per_worker, staged)


def cache_fill(loader: Any) -> tuple[int, int] | None:
    """(images held, images) of the training loader's image cache while it is being filled (cache=auto: loader
    workers store each image as they first decode it), or None where no cache is being filled. The loader is
    faster as it fills, so a window in the first epoch measures a loader between its cold and its cached speed."""
    ds = getattr(loader, "dataset", None)
    source = getattr(ds, "image_source", None)
    if ds is None or source is None:
        return None
    held = source.filled()
    return None if held is None else (held, len(ds))
