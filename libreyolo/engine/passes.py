"""Which epochs one training-loader pass spans, and opening it.

One pass runs over consecutive epochs (data/loader.TrainBatchSampler.set_span), so the workers decode the next
epoch while this one validates and checkpoints. A pass ends before an epoch at which the family's
`mosaic_close` hook is due, because the hook may change what the data or the loss is; the trainer runs the
hook and opens the next pass there. Shared by the setup, which opens the first pass as soon as the loaders exist
(the workers decode while the network, optimizer and step are built), and the trainer, which opens the others."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from libreyolo.config import TrainConfig
from libreyolo.data.dataset import capacity_bound
from libreyolo.data.loader import TrainBatchSampler
from libreyolo.families.base import HookFn


def mosaic_on(cfg: TrainConfig, epoch: int) -> bool:
    return cfg.mosaic > 0 and epoch < cfg.epochs - cfg.no_aug_epochs


def target_capacity(cfg: TrainConfig, labels: list[np.ndarray], start_epoch: int) -> int:
    """The most target slots per image a training batch of this run can need (the whole-step graph's capacity,
    known before its first capture): four images' boxes where some epoch of the run uses mosaic, else one's."""
    mosaic = any(mosaic_on(cfg, e) for e in range(start_epoch, cfg.epochs))
    return capacity_bound(labels, cfg.mosaic if mosaic else 0.0)


def hook_due(cfg: TrainConfig, hooks: Mapping[str, HookFn], epoch: int, start_epoch: int) -> bool:
    """The family's mosaic_close hook is due: at the epoch mosaic closes, or at the first epoch of a run
    (resumed, or shorter than no_aug_epochs) that starts after it, so the hook's change is never lost."""
    close = cfg.epochs - cfg.no_aug_epochs
    due = epoch == close or (epoch == start_epoch and epoch > close)
    return due and "mosaic_close" in hooks


def open_pass(
    cfg: TrainConfig,
    hooks: Mapping[str, HookFn],
    sampler: TrainBatchSampler,
    loader: Iterable[Any],
    epoch: int,
    start_epoch: int,
    start: int,
) -> tuple[Iterator[Any], int]:
    """Point the sampler at epoch (from batch `start`) and the epochs after it up to the run's end or the next
    hook epoch, and start the loader's iterator: persistent workers begin decoding at once. -> (iterator, the
    epoch the pass ends before). The caller runs a hook due at `epoch` first."""
    until = next((e for e in range(epoch + 1, cfg.epochs) if hook_due(cfg, hooks, e, start_epoch)), cfg.epochs)
    sampler.set_span([(e, mosaic_on(cfg, e)) for e in range(epoch, until)], start)
    return iter(loader), until


class Peekable(Iterator[Any]):
    """A loader pass whose first batch can be read ahead (the setup's kernel warm-up runs on the run's first batch)
    and is still the first one next() returns. A staged batch stays valid until the pass is asked for the next one
    (data/staging.py), which only the trainer does, after its first step has copied the batch to the device."""

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it
        self._ahead: list[Any] = []

    def peek(self) -> Any:
        """The first batch, without taking it (raises StopIteration for an empty pass)."""
        if not self._ahead:
            self._ahead.append(next(self._it))
        return self._ahead[0]

    def __next__(self) -> Any:
        return self._ahead.pop() if self._ahead else next(self._it)


def validation_due(cfg: TrainConfig, epoch: int) -> bool:
    """Whether the run validates after this epoch: every epoch with val=true, else only the last."""
    return bool(cfg.val or epoch == cfg.epochs - 1)
