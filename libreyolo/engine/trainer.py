"""The one training loop. A step is data -> to_device -> forward -> loss -> backward -> optimizer -> ema."""

from __future__ import annotations

import functools
import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from libreyolo import events as ev
from libreyolo.config import TrainConfig
from libreyolo.engine import optim, passes
from libreyolo.engine.checkpoint import best_so_far
from libreyolo.engine.epochval import EpochValidations, Landed, val_prefetch_due
from libreyolo.engine.heap import frozen_heap, held_collections
from libreyolo.engine.interrupt import StopSignals
from libreyolo.engine.judge import BestEpoch
from libreyolo.engine.loop import OnStart, RunLoop
from libreyolo.engine.meters import HostRead, Throughput
from libreyolo.engine.saver import RunSaver
from libreyolo.engine.seams import TrainableModel
from libreyolo.engine.setup import TrainSetup, build_run, resolve_resume
from libreyolo.engine.state import restore_rng, restore_train_state
from libreyolo.engine.step import NO_PHASES, Phases
from libreyolo.families.base import HookContext
from libreyolo.plots import PlotWriter

HEARTBEAT_S = 10.0


class Trainer:
    def __init__(self, model: TrainableModel, cfg: TrainConfig, on_start: Sequence[OnStart] = ()):
        """on_start: called with the trainer once the run is set up, before its first step (the profiler attaches its
        window so: the engine never imports the profiler, which sits above it)."""
        self.model, self.cfg, self.on_start = model, cfg, tuple(on_start)
        self.phases: Phases = NO_PHASES  # the profiler swaps this for its window, then puts it back
        self.best = BestEpoch(cfg.patience)  # the run's best validation and early stopping: judged here only
        self.bad_files: set[str] = set()
        self.epoch, self.step_in_epoch, self.epochs_done = 0, 0, 0
        self._setup: TrainSetup | None = None
        self.after_step: Callable[[RunLoop], None] | None = None  # after every step (the profiler's window)
        self.stop_requested: str | None = None  # a run status: the loop ends after the current step
        self.signals = StopSignals(enabled=False)  # Ctrl-C / SIGTERM: the loop stops at the next step boundary
        self._resumed_loss: dict[str, Any] | None = None  # a mid-epoch last.pt's loss sums of its epoch so far
        self._held: list[ev.Event] | None = []
        self._probe_scale = False  # a fresh float16 run reads its start loss scale off the first batch
        self.saver = RunSaver(self.emit)  # closed when train() ends: one Trainer trains once
        self.writer = self.saver.writer

    # --- events -------------------------------------------------------------------------------------
    def emit(self, event: ev.Event) -> None:
        """Send an event to every sink. Events raised while the run is being set up are held back until
        run_start has been written, so every events.jsonl begins with run_start."""
        if event.type == "run_start":
            held, self._held = self._held or [], None
            for e in [event, *held]:
                self._send(e)
        elif self._held is not None:
            self._held.append(event)
        else:
            self._send(event)

    def _send(self, event: ev.Event) -> None:
        for cb in self._setup.sinks if self._setup else []:
            cb(event)

    @property
    def s(self) -> TrainSetup:
        """What build_run made for this run; there is none before train() starts."""
        if self._setup is None:
            raise RuntimeError("the trainer has no setup yet: train() builds it")
        return self._setup

    @s.setter
    def s(self, setup: TrainSetup) -> None:
        self._setup = setup

    # --- the run ------------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        with held_collections():  # through the start; the epochs run on a frozen heap (engine/heap.py)
            return self._run()

    def _run(self) -> dict[str, float]:
        t0 = time.time()
        undo: list[Callable[[], None]] = []
        try:
            self.cfg, ckpt = resolve_resume(self.model, self.cfg)
            self.s = s = build_run(self.model, self.cfg, self.emit, ckpt, undo)
            if ckpt is not None:  # the kernel warm-up's backward may still run: it touches nothing restored here
                self.restore(ckpt)
            s.dist.seed_rank(self.cfg.seed)
            if not s.resumed:  # pickled while the validation's copy waits for the warm-up, not beside the first steps
                self.save("last")
        except BaseException:
            for fn in reversed(undo):  # the loader workers the setup had started
                fn()
            raise
        self.vals = EpochValidations(s, self.cfg, self.emit, self._note_bad, self._judge)
        self.plots = plot_writer(s, self.cfg, lambda msg: self.emit(ev.WarningEvent(msg, code="plots")))
        self.vals.on_result = self.plots.validation  # each validation's result, after its results.csv row
        status = "failed"
        try:
            self.emit(s.run_start_event())
            self.emit(s.amp_event())
            s.join_kernel_warmup()  # before the first step: nothing may capture a graph beside its backward
            for msg in s.notes:
                self.emit(ev.WarningEvent(msg, code="setup"))
            self._probe_scale = s.amp.scaler and not s.resumed
            if self._probe_scale and s.warm_scale is not None:  # the warm-up read it off the first batch
                self._start_loss_scale(None, None, None)
            for start in self.on_start:  # what the caller attached (the profiler's window, with profile=true)
                start(self)
            self.signals = StopSignals(enabled=s.world_size == 1)
            with frozen_heap(), self.signals:
                ended = self._epochs()
            self.writer.drain(wait=True)  # a failed write fails the run
            s.dist.finish()  # DDP: no rank leaves before rank 0 has written its checkpoints
            status = ended
        except KeyboardInterrupt:
            status = "interrupted"
            if s.world_size == 1:  # an evaluation in flight still lands: results.csv and best.pt stay complete
                self.vals.settle(wait=True)
            self.save("last", kind="interrupt", wait=True)
            raise
        except BaseException as e:
            self.emit(ev.ErrorEvent(f"{type(e).__name__}: {e}", traceback.format_exc()))
            raise
        finally:
            self.vals.wait_device()  # a validation thread must be off the device before the loaders close
            self.vals.close()
            self.plots.close()  # the last pictures are written before run_end
            self.saver.close()
            self.emit(
                ev.RunEnd(
                    status=status,
                    epochs_done=self.epochs_done,
                    best_fitness=self.best.fitness,
                    best=str(s.best_path) if s.best_path.exists() else None,
                    last=str(s.last_path) if s.last_path.exists() else None,
                    time_s=time.time() - t0,
                    metrics=self.best.metrics,
                )
            )
            s.close()
        return self.best.metrics

    def _epochs(self) -> str:
        s, cfg = self.s, self.cfg
        # the setup opened the first pass early (engine/passes.py), unless a family hook is due first
        (it, until), s.first_pass = s.first_pass or (None, s.start_epoch), None
        for epoch in range(s.start_epoch, cfg.epochs):
            self.epoch = epoch
            if epoch == until:
                it, until = self._open_pass(epoch)
            self._train_epoch(epoch, it)
            if self.stop_requested:
                return self.stop_requested
            self._end_epoch(epoch)
            self.epochs_done = epoch + 1
            if self.stop_requested:  # early stopping, decided when a validation landed
                return self.stop_requested
        self.vals.settle(wait=True)  # the final epoch waits for its evaluation
        return self.stop_requested or "finished"

    def _first_step(self, epoch: int) -> int:
        """The batch an epoch starts from: a resumed run's first epoch skips those already trained."""
        return self.s.start_step if epoch == self.s.start_epoch else 0

    def _open_pass(self, epoch: int) -> tuple[Any, int]:
        """A new loader pass from this epoch on (engine/passes.py), after the family hook due at this epoch has run.
        Batches depend only on (seed, epoch, index), never on when or in which pass they are made, so a resumed run
        gets the same ones. -> (iterator, the epoch it ends before)."""
        s = self.s
        hooks = s.family.hooks
        if passes.hook_due(self.cfg, hooks, epoch, s.start_epoch):
            hooks["mosaic_close"](HookContext(epoch, (s.loss_fn, s.val_loss), s.step.invalidate))
            self.vals.invalidate()  # the hook may change what the (validation) loss computes
        return passes.open_pass(
            self.cfg, hooks, s.sampler, s.train_loader, epoch, s.start_epoch, self._first_step(epoch)
        )

    def _train_epoch(self, epoch: int, it: Any) -> None:
        s, cfg = self.s, self.cfg
        start = self._first_step(epoch)
        mosaic = passes.mosaic_on(cfg, epoch)
        nb = s.sampler.batches_per_epoch()
        self._stop_if_signalled(epoch, start)  # received between epochs
        self.emit(ev.EpochStart(epoch=epoch, epochs=cfg.epochs, steps=nb, mosaic=mosaic))
        s.train_net.train()
        s.meter.reset()
        if start and self._resumed_loss is not None and s.world_size == 1:  # the row averages the epoch's every step
            s.meter.load(self._resumed_loss)
        self._epoch_t0 = time.time()
        thr = Throughput()
        last_event = last_beat = time.perf_counter()
        i = start
        self.step_in_epoch = start
        val_prefetched = False
        while i < nb:  # the pass may go on into the next epochs
            ph = self.phases
            t = time.perf_counter()
            with ph("data"):
                batch = next(it)
            data_s = time.perf_counter() - t
            self._note_bad(batch["bad"])
            if not val_prefetched and val_prefetch_due(nb - i, thr.steady_step_ms / 1000 if thr.steps >= 2 else None):
                val_prefetched = True
                self.vals.prefetch(epoch)
            s.schedule(s.optimizer, cfg, epoch, epoch * nb + i, s.warmup_iters, s.momentum, nb)
            with ph("to_device"):
                img = batch["img"].to(s.device, non_blocking=True)
                targets = batch["targets"].to(s.device, non_blocking=True)
                mask = batch["mask"].to(s.device, non_blocking=True)
            self.plots.train_batch(epoch, img, targets, mask)  # kept for train_batchN.jpg: the first epoch's first 3
            boundary = (i + 1) % s.accumulate == 0 or i == nb - 1
            if self._probe_scale:
                self._start_loss_scale(img, targets, mask)
            items = s.step(img, targets, mask, boundary, ph)
            s.meter.add(items)
            self.vals.after_step()  # a few steps in, the validation's graph is captured beside the steps
            thr.add(img.shape[0], data_s)
            i += 1
            if boundary:
                self.step_in_epoch = i
                self._stop_if_signalled(epoch, i)
            now = time.perf_counter()
            if now - last_event >= cfg.log_interval or i == nb or i == start + 1:  # the first step: the run is moving
                last_event = now
                self._step_event(epoch, i, nb, start, thr)
            if now - last_beat >= HEARTBEAT_S:
                last_beat = now
                self.emit(ev.Heartbeat(epoch=epoch, step=i, pid=os.getpid()))
            if self.after_step is not None:
                self.after_step(self)
            if self.stop_requested:
                break

    def _stop_if_signalled(self, epoch: int, step: int) -> None:
        """At an optimizer-step boundary: a Ctrl-C or SIGTERM received meanwhile stops the run here (interrupt.py)."""
        if self.signals.requested:
            msg = f"{self.signals.requested}: stopping at epoch {epoch + 1}, step {step}, an optimizer-step boundary"
            self.emit(ev.WarningEvent(msg + "; last.pt is saved there and resume= continues exactly", code="signal"))
            raise KeyboardInterrupt

    def _start_loss_scale(self, img: torch.Tensor | None, targets: torch.Tensor | None, mask: Any) -> None:
        """float16: the run's start loss scale (TrainSetup.start_scale), in one amp event."""
        self._probe_scale = False
        scale, reason = self.s.start_scale(img, targets, mask)
        amp = ev.Amp(
            enabled=True, dtype=self.s.amp.dtype, scaler=True, scale=scale, skipped_steps=0, epoch=None, reason=reason
        )
        self.emit(amp)

    def _step_event(self, epoch: int, i: int, nb: int, start: int, thr: Throughput) -> None:
        s = self.s
        self.writer.drain()  # checkpoint events of the writes that landed meanwhile
        self.vals.settle(wait=False)  # metrics, best.pt and early stopping as soon as an evaluation lands
        s.meter.request()
        losses = dict(zip(s.family.loss_terms, s.meter.poll()))
        done = (epoch - s.start_epoch) * nb + (i - start)
        total = (self.cfg.epochs - s.start_epoch) * nb - start
        eta = thr.steady_step_ms / 1000 * (total - done)
        mem = torch.cuda.memory_reserved(s.device) / 1e9 if s.device.type == "cuda" else 0.0
        self.emit(
            ev.Step(
                epoch=epoch,
                step=i,
                steps=nb,
                losses=losses,
                lr=optim.reported_lr(s.optimizer),
                img_s=thr.img_s * s.world_size,
                data_frac=thr.data_frac,
                step_ms=thr.step_ms,
                gpu_mem_gb=mem,
                eta_s=eta,
            )
        )

    def _note_bad(self, paths: list[str]) -> None:
        for p in paths:
            if p not in self.bad_files:
                self.bad_files.add(p)
                self.emit(
                    ev.WarningEvent(
                        f"skipped unreadable image {p} (replaced by its neighbour in the batch)", code="bad_image"
                    )
                )

    def _judge(self, landed: Landed) -> None:
        """Every rank, as each validation lands: best.pt from the weights validated, and early stopping."""
        improved, out_of_patience = self.best.judge(landed.fitness, landed.metrics)
        if improved:
            self.save("best", weights=landed.weights, epoch=landed.epoch + 1)
        if out_of_patience and not self.stop_requested:
            p = self.cfg.patience
            self.emit(ev.WarningEvent(f"early stop: no improvement in {p} epochs (patience={p})", code="patience"))
            self.stop_requested = "early_stop"

    def _end_epoch(self, epoch: int) -> None:
        """Losses of the epoch, its validation started (its COCO evaluation lands later: EpochValidations), last.pt,
        and the epoch's amp, vram and epoch_end events. Nothing before last.pt's snapshot waits for the device: the
        epoch's loss sums, skipped steps and loss scale are copied behind its last step (HostRead) and taken after the
        snapshot, so the loop's host work here runs while the GPU finishes the steps the loop had queued ahead."""
        s, cfg = self.s, self.cfg
        t_epoch = time.time()
        fp16 = s.amp.scaler
        scaler_values = {"scale": s.scaler._scale, "skipped": s.step.skipped} if fp16 else {}
        read = HostRead({"sum": s.meter.sum, **scaler_values}).get
        count, terms = s.meter.count, s.family.loss_terms
        if s.world_size > 1:  # the mean over ranks is a collective: every rank takes part here, at the same point
            ranks_mean = dict(zip(terms, s.dist.mean(s.meter.final(), s.device)))
            train_losses: Callable[[], dict[str, float]] = lambda: ranks_mean  # noqa: E731
        else:
            train_losses = functools.cache(lambda: dict(zip(terms, (read()["sum"] / max(count, 1)).tolist())))
        lrs = {f"pg{j}": g["lr"] for j, g in enumerate(s.optimizer.param_groups)}
        self.vals.start(epoch, train_losses, lrs)
        self.epoch, self.step_in_epoch = epoch + 1, 0
        self.save("last")
        if cfg.save_period > 0 and (epoch + 1) % cfg.save_period == 0:
            self.save("period", path=s.run_dir / "weights" / f"epoch{epoch + 1}.pt")
        losses = train_losses()
        if s.amp.scaler:
            self.emit(s.epoch_amp_event(epoch, read()))
        vram = s.take_vram_peak(epoch)
        if vram is not None:
            self.emit(vram)
        n_imgs = s.sampler.sampler.num_samples * s.world_size
        landed = self.vals.fitness.get(epoch)
        self.emit(
            ev.EpochEnd(
                epoch=epoch,
                losses=losses,
                lr=lrs,
                time_s=time.time() - self._epoch_t0,
                img_s=n_imgs / max(t_epoch - self._epoch_t0, 1e-9),
                fitness=landed,
                best_fitness=self.best.fitness,
                skipped_images=len(self.bad_files),
            )
        )

    # --- checkpoints --------------------------------------------------------------------------------
    def save(
        self,
        which: str,
        kind: str | None = None,
        path: Path | None = None,
        wait: bool = False,
        weights: dict[str, torch.Tensor] | None = None,
        epoch: int | None = None,
    ) -> Path:
        """which: last (full train state) | best | period (weights only), at the loop's position (engine/saver.py)."""
        at = (self.epoch, self.step_in_epoch) if epoch is None else (epoch, 0)
        return self.saver.save(self.s, self.cfg, which, at, self.best, self.bad_files, kind, path, wait, weights)

    def restore(self, ckpt: dict[str, Any]) -> None:
        """Put a last.pt's train state back (once build_run has built everything)."""
        s = self.s
        restore_train_state(ckpt, s.train_net, s.optimizer, s.scaler, s.ema)
        s.step.reload()  # after everything it derives from is back
        restore_rng(ckpt["train"]["rng"])
        fitness, metrics = best_so_far(s.best_path, ckpt.get("best_fitness"), dict(ckpt.get("metrics") or {}))
        self.best = BestEpoch(self.cfg.patience, fitness, metrics)
        self.bad_files = set(ckpt["train"].get("bad_files", []))
        self.epoch, self.step_in_epoch = int(ckpt["epoch"]), int(ckpt["step"])
        self._resumed_loss = ckpt["train"].get("epoch_loss")
        self.epochs_done = self.epoch


def plot_writer(s: TrainSetup, cfg: TrainConfig, warn: Callable[[str], None]) -> PlotWriter:
    """The run's picture writer (libreyolo/plots): enabled with plots=true on rank 0."""
    train_ds = getattr(s.train_loader, "dataset", None)
    val_loader = s.val_loader
    return PlotWriter(
        s.run_dir,
        s.names,
        s.family.task,
        enabled=bool(cfg.plots) and s.is_main,
        epochs=cfg.epochs,
        train_labels=getattr(getattr(train_ds, "labels", None), "labels", None),
        val_dataset=getattr(val_loader, "dataset", None),
        val_batch=getattr(val_loader, "batch_size", None) or 16,
        warn=warn,
    )
