"""Loaders: a batch sampler that carries (index, epoch, mosaic) to the workers, and sane worker defaults."""

from __future__ import annotations

import math
from typing import Iterator

import cv2
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from libreyolo.data.cpus import cpu_count
from libreyolo.data.dataset import YOLODataset, collate


# Beyond this, more workers per GPU add memory (each is a process with its own copy-on-write heap and
# queued batches) faster than images/s; measure with `libreyolo bench loader` before raising workers=.
MAX_WORKERS_PER_GPU = 16


def default_workers(batch: int, n_gpus: int) -> int:
    """GPU training: every CPU but one per GPU decodes (that one runs the training loop and the pin-memory
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

    It runs in the main process, so changing epoch/mosaic/start here reaches persistent workers through
    the keys it yields; `start` skips batches already trained when resuming mid-epoch."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        self.batch_size = batch_size
        self.sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.epoch, self.mosaic, self.start = 0, True, 0

    def set_epoch(self, epoch: int, mosaic: bool, start: int = 0) -> None:
        self.epoch, self.mosaic, self.start = epoch, mosaic, start

    def batches_per_epoch(self) -> int:
        return math.ceil(self.sampler.num_samples / self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch() - self.start

    def __iter__(self) -> Iterator[list]:
        self.sampler.set_epoch(self.epoch)
        idx = list(self.sampler)
        for b in range(self.start, self.batches_per_epoch()):
            yield [(i, self.epoch, self.mosaic) for i in idx[b * self.batch_size : (b + 1) * self.batch_size]]


def _worker_init(_: int) -> None:
    # workers each decode one image at a time: library thread pools would only oversubscribe the CPUs
    cv2.setNumThreads(0)
    torch.set_num_threads(1)


def train_loader(dataset: YOLODataset, batch_size: int, workers: int, seed: int, pin: bool, rank: int = 0, world_size: int = 1) -> DataLoader:
    sampler = TrainBatchSampler(len(dataset), batch_size, seed, rank, world_size)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        persistent_workers=workers > 0,
        prefetch_factor=prefetch_factor(workers),
        worker_init_fn=_worker_init if workers > 0 else None,
    )


def val_loader(dataset: YOLODataset, batch_size: int, workers: int, pin: bool) -> DataLoader:
    """Not persistent: validation workers exist only while validating, not for the whole run."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        worker_init_fn=_worker_init if workers > 0 else None,
    )
