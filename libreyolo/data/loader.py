"""Loaders: a batch sampler that carries (index, epoch, mosaic) to the workers, and sane worker defaults."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import cv2
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from libreyolo.data.cpus import cpu_count
from libreyolo.data.dataset import YOLODataset, collate
from libreyolo.data.staging import PinnedStager

# Beyond this, more workers per GPU add memory (each is a process with its own copy-on-write heap and
# queued batches) faster than images/s; measure with `libreyolo bench loader` before raising workers=.
MAX_WORKERS_PER_GPU = 16


def default_workers(batch: int, n_gpus: int) -> int:
    """GPU training: every CPU but one per GPU decodes (that one runs the training loop and the staging
    thread), at most MAX_WORKERS_PER_GPU and at most `batch` (a bound kept for tiny debugging batches).
    CPU training leaves cores to compute."""
    cpus = cpu_count()
    if n_gpus > 0:
        return max(1, min(MAX_WORKERS_PER_GPU, cpus // n_gpus - 1, batch))
    return max(0, min(4, cpus // 2))


def prefetch_factor(workers: int) -> int | None:
    """Batches each worker keeps queued: 4 for one to three workers to ride out slow images, 2 beyond (then
    2 x workers whole batches wait in shared memory, plenty, and /dev/shm is not filled with them)."""
    if workers <= 0:
        return None
    return 4 if workers < 4 else 2


class TrainBatchSampler(Sampler[list]):
    """Shuffles per epoch (seed + epoch) and shards across ranks through torch's DistributedSampler.

    It runs in the main process, so what is set here reaches persistent workers through the keys it yields.
    One pass may span several epochs (set_span): the workers then go on decoding the next epoch's batches while
    the trainer validates and checkpoints, instead of idling between passes and making the next epoch's first
    step wait for a whole batch. `start` skips batches of the first epoch already trained when resuming."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        self.batch_size = batch_size
        self.sampler = DistributedSampler(
            range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=False
        )
        self.epochs: list[tuple[int, bool]] = [(0, True)]  # (epoch, mosaic) of each epoch of the next pass
        self.start = 0

    def set_epoch(self, epoch: int, mosaic: bool, start: int = 0) -> None:
        """The next pass is this one epoch."""
        self.set_span([(epoch, mosaic)], start)

    def set_span(self, epochs: list[tuple[int, bool]], start: int = 0) -> None:
        """The next pass runs these (epoch, mosaic) in order, the first from batch `start`."""
        if not epochs:
            raise ValueError("a pass needs at least one epoch")
        self.epochs, self.start = list(epochs), start

    def batches_per_epoch(self) -> int:
        return math.ceil(self.sampler.num_samples / self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch() * len(self.epochs) - self.start

    def __iter__(self) -> Iterator[list]:
        start = self.start
        for epoch, mosaic in self.epochs:
            self.sampler.set_epoch(epoch)
            idx = list(self.sampler)
            for b in range(start, self.batches_per_epoch()):
                yield [(i, epoch, mosaic) for i in idx[b * self.batch_size : (b + 1) * self.batch_size]]
            start = 0


# Loader workers run this much nicer than the training process. Where the CPUs are oversubscribed (on the H200
# host 15 workers fill their queues while the setup builds the step, and decode beside the step's kernel launches
# and the validation thread) the main process's threads go first: with it the setup's EMA copy took 0.12 s instead
# of 0.29-0.35 s (docs/performance.md). On idle CPUs it changes nothing.
WORKER_NICE = 10


def _worker_init(_: int) -> None:
    # workers each decode one image at a time: library thread pools would only oversubscribe the CPUs
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    if hasattr(os, "nice"):  # not on Windows
        try:
            os.nice(WORKER_NICE)
        except OSError:  # a sandbox may refuse it: the worker keeps the parent's priority
            pass


# what the training step reads on the device (engine/trainer.py): the staging thread copies these there ahead
STEP_KEYS = ("img", "targets", "mask")


class TrainLoader(DataLoader):
    """A DataLoader whose passes are page-locked through data/staging.PinnedStager when `stage_to` is a CUDA
    device, instead of torch's pin-memory thread (which page-locks every queued batch), and whose STEP_KEYS that
    thread also copies to the device, on a stream of its own. It keeps the pass it opened last, so that opening
    the next one or releasing the workers ends its staging thread first."""

    def __init__(self, *args: Any, stage_to: torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage_to = stage_to if stage_to is not None and stage_to.type == "cuda" else None
        self._stager: PinnedStager | None = None

    def __iter__(self) -> Iterator[Any]:
        self.close_stager()  # persistent workers: the new pass resets the iterator the old one was reading
        it = super().__iter__()
        if self.stage_to is None:
            return it
        self._stager = PinnedStager(it, self.stage_to, to_device=STEP_KEYS)
        return self._stager

    def close_stager(self) -> None:
        if self._stager is not None:
            self._stager.close()
            self._stager = None


def train_loader(
    dataset: YOLODataset,
    batch_size: int,
    workers: int,
    seed: int,
    pin: bool,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | None = None,
) -> TrainLoader:
    """pin: page-locked batches for `device` (a CUDA device; the current one if None), through PinnedStager."""
    sampler = TrainBatchSampler(len(dataset), batch_size, seed, rank, world_size)
    stage_to = (device or torch.device("cuda", torch.cuda.current_device())) if pin else None
    return TrainLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        stage_to=stage_to,
        persistent_workers=workers > 0,
        prefetch_factor=prefetch_factor(workers),
        worker_init_fn=_worker_init if workers > 0 else None,
        # the workers' base seed comes from the loader's own generator, one per rank: opening a pass (the setup
        # opens the first one early) leaves the process-global random streams as they were
        generator=torch.Generator().manual_seed(seed + rank),
    )


# Validation batches queued ahead, in images: enough to hold a small validation set whole (prefetch() then
# decodes all of it while the last training steps run), bounded for large sets: at 640 px a letterboxed image
# is 1.2 MB of shared memory
VAL_QUEUE_IMAGES = 512


def default_val_workers(train_workers: int) -> int:
    """Workers for validation inside training: half the training workers, 1 to 8. Persistent validation workers
    live next to the training ones (memory), and they get a head start through prefetch(); 8 decode 640 px JPEGs
    at ~1,000 images/s, the rate the GPU validates at."""
    return max(1, min(8, train_workers // 2)) if train_workers > 0 else 0


def val_prefetch_factor(n_batches: int, batch_size: int, workers: int) -> int | None:
    if workers <= 0:
        return None
    whole = math.ceil(n_batches / workers)
    budget = max(1, VAL_QUEUE_IMAGES // max(1, batch_size * workers))
    return max(prefetch_factor(workers), min(whole, budget))


class ValLoader(DataLoader):
    """The validation loader: letterboxed uint8 batches in dataset order, each of batch_size images but the last
    (and but for unreadable images, which are reported in batch["bad"] and left out), collated with the
    letterbox of every image (scale, pad, shape) and pinned when pin is set.

    persistent=True keeps the workers from one validation to the next (no start-up per epoch). prefetch() starts
    the next pass at once, so the workers decode while the caller still does something else (the last training
    steps); the next iteration then continues that pass instead of starting another. close() stops the workers
    (training must call it when it ends: left to interpreter exit, torch joins each persistent worker with a 5 s
    timeout)."""

    dataset: YOLODataset
    batch_size: int

    def __init__(self, dataset: YOLODataset, batch_size: int, workers: int, pin: bool, persistent: bool = False):
        n_batches = math.ceil(len(dataset) / max(1, batch_size))
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=pin,
            persistent_workers=persistent and workers > 0,
            prefetch_factor=val_prefetch_factor(n_batches, batch_size, workers),
            worker_init_fn=_worker_init if workers > 0 else None,
            # each pass's worker seed comes from here, not from torch's global generator: validation draws nothing,
            # so when or how often it starts its workers leaves training's random stream as it was
            generator=torch.Generator().manual_seed(0),
        )
        self._ahead: Iterator | None = None  # a pass started by prefetch() (non-persistent workers)
        self._primed = False  # persistent workers: DataLoader keeps the started pass in _iterator

    def prefetch(self) -> None:
        """Start the next pass now (workers begin decoding); a second call before iterating does nothing."""
        if self._primed or self._ahead is not None:
            return
        it = super().__iter__()
        if self.persistent_workers:
            self._primed = True
        else:
            self._ahead = it

    def __iter__(self) -> Iterator:
        if self._ahead is not None:
            it, self._ahead = self._ahead, None
            return it
        if self._primed and getattr(self, "_iterator", None) is not None:
            self._primed = False
            return self._iterator
        self._primed = False
        return super().__iter__()

    def close(self) -> None:
        """Stop the workers now: dropping the iterator sends them their stop sentinel."""
        self._ahead, self._primed = None, False
        if getattr(self, "_iterator", None) is not None:
            self._iterator = None


def val_loader(dataset: YOLODataset, batch_size: int, workers: int, pin: bool, persistent: bool = False) -> ValLoader:
    """Not persistent unless asked: `ValLoader` says how persistent validation workers are opened early and
    released."""
    return ValLoader(dataset, batch_size, workers, pin, persistent)


def release_workers(loader: torch.utils.data.DataLoader[Any]) -> None:
    """Stop a loader's persistent workers now. Left to interpreter exit, torch's atexit hook joins each
    worker with a 5 s timeout before terminating it: 15 workers cost 75 s after a finished run (seen on
    the H200). The iterator sends the workers their stop sentinel and joins them (what its __del__ does), here
    and now, as other references to it (a traceback's frames) may keep it alive."""
    if isinstance(loader, TrainLoader):
        loader.close_stager()
    it = getattr(loader, "_iterator", None)
    if it is not None:
        loader._iterator = None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
