"""TensorBoard logging (`tensorboard=true`): a sink of the event stream, like the rich renderer.

Rank 0 feeds it the same events it writes to events.jsonl; it turns them into scalars under
`<run dir>/tensorboard/`. The per-epoch tags are results.csv's column names (Ultralytics' names, which its
TensorBoard logging uses too): `train/<term>_loss` and `val/<term>_loss` for each of the family's loss terms
(`run_start.loss_terms`), `metrics/precision(B)`, `metrics/recall(B)`, `metrics/mAP50(B)`,
`metrics/mAP50-95(B)`, `lr/pg0..2`, at step = epoch number (1-based). Within an epoch, every `step` event adds
`step/<term>_loss`, `step/lr`, `step/img_s`, `step/data_frac` and, on a GPU, `step/gpu_mem_gb` at step = batches
trained so far."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from libreyolo import events as ev
from libreyolo.errors import ConfigError
from libreyolo.tasks import DETECT, TASKS

INSTALL = (
    'tensorboard=true needs the tensorboard package: pip install "libreyolo[tensorboard]" (or pip install tensorboard)'
)


def require_tensorboard() -> None:
    """Raise ConfigError saying how to install it when the tensorboard package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(INSTALL)


class TensorBoardLogger:
    """A callback: feed it events; `close()` flushes and closes the event file."""

    def __init__(self, log_dir: str | os.PathLike):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter  # imported only when asked: it pulls in tensorboard

        self.log_dir = str(log_dir)
        self._w: Any = SummaryWriter(self.log_dir)
        self._terms: list[str] = []
        self._steps_per_epoch = 0

    def __call__(self, e: ev.Event) -> None:
        if self._w is None:
            return
        handler = getattr(self, "_on_" + e.type, None)
        if handler:
            handler(e)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None

    def _scalars(self, values: dict[str, float], step: int) -> None:
        for tag, v in values.items():
            if v is not None:
                self._w.add_scalar(tag, float(v), step)

    def _losses(self, prefix: str, losses: dict[str, float]) -> dict[str, float]:
        return {f"{prefix}/{k}_loss": losses[k] for k in self._terms or losses if k in losses}

    # --- handlers -----------------------------------------------------------------------------------
    def _on_run_start(self, e: ev.RunStart) -> None:
        self._terms, self._steps_per_epoch = list(e.loss_terms), e.steps_per_epoch
        self._task = TASKS.get(e.task, DETECT)

    def _on_step(self, e: ev.Step) -> None:
        step = e.epoch * (self._steps_per_epoch or e.steps) + e.step
        values = {**self._losses("step", e.losses), "step/lr": e.lr, "step/img_s": e.img_s}
        values["step/data_frac"] = e.data_frac
        if e.gpu_mem_gb:
            values["step/gpu_mem_gb"] = e.gpu_mem_gb
        self._scalars(values, step)

    def _on_val(self, e: ev.Val) -> None:
        task = getattr(self, "_task", DETECT)  # results.csv's column names: the task's
        metrics = {m.column: e.metrics[m.name] for m in task.metrics if m.name in e.metrics}
        self._scalars({**metrics, **self._losses("val", e.losses)}, e.epoch + 1)

    def _on_epoch_end(self, e: ev.EpochEnd) -> None:
        values = {**self._losses("train", e.losses), **{f"lr/{k}": v for k, v in e.lr.items()}}
        values.update({"speed/img_s": e.img_s, "speed/epoch_s": e.time_s, "fitness": e.fitness})
        self._scalars(values, e.epoch + 1)
        self._w.flush()

    def _on_vram(self, e: ev.Vram) -> None:
        self._scalars(
            {"gpu/peak_allocated_mb": e.peak_allocated_mb, "gpu/peak_reserved_mb": e.peak_reserved_mb}, e.epoch + 1
        )

    def _on_run_end(self, e: ev.RunEnd) -> None:
        self.close()
