"""The run's checkpoints as the loop asks for them: last.pt (the full train state), best.pt and the period files
(weights only). Each is snapshotted on the loop's thread (engine/snapshot.py) and written atomically by the
background writer (engine/checkpoint.py); its `checkpoint` event comes once the file is in place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from libreyolo import events as ev
from libreyolo.config import TrainConfig
from libreyolo.engine.checkpoint import CheckpointWriter
from libreyolo.engine.judge import BestEpoch
from libreyolo.engine.setup import TrainSetup
from libreyolo.engine.snapshot import Amended, Snapshot, snapshot
from libreyolo.engine.state import model_record, train_state


class RunSaver:
    def __init__(self, emit: Callable[[ev.Event], None]) -> None:
        self.emit = emit
        self.writer = CheckpointWriter()
        self._epoch_end_record: tuple[int, Snapshot] | None = None  # (epoch, the model record last.pt saved then)

    def save(
        self,
        s: TrainSetup,
        cfg: TrainConfig,
        which: str,
        at: tuple[int, int],
        best: BestEpoch,
        bad_files: set[str],
        kind: str | None = None,
        path: Path | None = None,
        wait: bool = False,
        weights: dict[str, torch.Tensor] | None = None,
    ) -> Path:
        """cfg: the run's configuration as it is now (a resume replaces the trainer's first one by its checkpoint's);
        which: last | best | period; at: (epoch, step) the weights finished; best: the run's best validation so far;
        bad_files: the images skipped so far (a resumed run keeps counting them). weights: what to save instead of the
        current (EMA) weights (a best.pt decided when its validation landed, an epoch later)."""
        if not s.is_main:
            return s.last_path
        path = path or (s.last_path if which == "last" else s.best_path)
        epoch, step = at
        done = lambda p: self.emit(ev.Checkpoint(path=str(p), kind=kind or which, epoch=epoch, step=step))  # noqa: E731
        end = self._epoch_end_record
        if which == "best" and end is not None and end[0] == epoch:
            # the weights validated are the ones the epoch ended with, already snapshotted for its last.pt
            self.writer.submit(Amended(end[1], best_fitness=best.fitness, metrics=best.metrics), path, done)
            self.writer.drain(wait=wait)
            return path
        if which == "last":
            s.step.sync()  # an overlapped backward ends before the optimizer state is taken
        ema_is_model = weights is None and s.ema is not None
        if weights is None:
            weights = s.kept_net.state_dict()
        record = model_record(s.family.name, s.size, s.names, weights, cfg.imgsz, cfg.to_dict())
        record.update(epoch=epoch, step=step, best_fitness=best.fitness, metrics=best.metrics)
        model = snapshot(record)
        if which == "last":
            # packed (engine/snapshot.py); the EMA weights are the record's model already, stored once
            parts = (s.train_net, s.step.train_counters(), s.optimizer_name, s.scaler, s.ema)
            state = train_state(*parts, ema_is_model, str(s.run_dir), bad_files)
            if step:  # mid-epoch: the epoch's loss sums so far, for its results.csv row after a resume
                state["epoch_loss"] = s.meter.state()
            train = snapshot(state, packed=True)
            if step == 0:  # an epoch's end: its validation may make these weights the best (save("best") above)
                self._epoch_end_record = (epoch, model)
            self.writer.submit(Amended(model, train=train), path, done)
        else:
            self.writer.submit(model, path, done)
        self.writer.drain(wait=wait)
        return path

    def close(self) -> None:
        """Let pending writes land before run_end (a crash keeps the last.pt the loop had asked for)."""
        try:
            self.writer.close()
        except Exception as e:  # the run is already ending with its own error; this one must not hide it
            self.emit(ev.WarningEvent(f"writing a checkpoint failed: {type(e).__name__}: {e}", code="checkpoint"))
