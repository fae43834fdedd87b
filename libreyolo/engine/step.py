"""One training step in named phases: forward -> loss -> backward [-> optimizer -> ema at accumulation boundaries].

The data and to_device phases belong to the loop (trainer.py). The profiler and the CUDA-graph manager hook
these names; `phases` is a no-op object unless the profiler swaps in its own for its window."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from libreyolo.engine.ema import ModelEMA
from libreyolo.engine.flat import FlatParams
from libreyolo.engine.overlap import PendingBackward
from libreyolo.families.base import LossFn
from libreyolo.nn.inputs import normalize

PHASES = ("data", "to_device", "forward", "loss", "backward", "optimizer", "ema")


class NoPhases:
    """The default: entering a phase costs one attribute lookup and a shared null context."""

    _null = contextlib.nullcontext()

    def __call__(self, name: str) -> AbstractContextManager[None]:
        return self._null


NO_PHASES = NoPhases()
# what a step enters around each phase: NO_PHASES, or the profiler's timer during its window
Phases = Callable[[str], AbstractContextManager[Any]]


class TrainCounters(NamedTuple):
    """What a checkpoint's train state takes from the optimizer and the EMA. A whole-step graph keeps the AdamW step
    and the EMA's update count on the device: they are device tensors here then, copied by the checkpoint's snapshot
    behind the steps already queued, never read on the host (a read waits for every queued step)."""

    optimizer: dict[str, Any]  # optimizer.state_dict(); a whole-step graph puts its device AdamW steps in it
    ema_updates: int | torch.Tensor | None  # None without an EMA


class StepRunner(Protocol):
    """What the trainer calls for a step: EagerStep, or a CUDA-graph runner (netgraph.py, fullstep.py)."""

    skipped: torch.Tensor | None  # float16 optimizer steps skipped for inf/NaN gradients since last read (device)
    captures_loss: bool  # whether a captured graph holds the loss (a change to the loss then needs a re-capture)
    captures: int  # CUDA graphs captured so far (the profiler's window moves past the steps that capture)

    def __call__(
        self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases = ...
    ) -> torch.Tensor:
        """One micro-step (an optimizer step too when boundary); -> the detached loss terms."""

    def sync(self) -> None:
        """Before a checkpoint: what the host still has in flight ends (an overlapped backward)."""

    def train_counters(self) -> TrainCounters:
        """The optimizer state and EMA update count a checkpoint saves, as they are after the steps issued so far."""

    def reload(self) -> None:
        """Refresh what derives from the weights after they were loaded (resume)."""

    def invalidate(self, reason: str) -> None:
        """What the step computes changed (a family hook): drop captured graphs; they are captured anew."""

    def close(self) -> None:
        """The run is over: give back the graphs and memory pools the runner holds."""


def train_forward(
    call: Callable[[torch.Tensor], Any], img: torch.Tensor, autocast_dtype: torch.dtype | None, channels_last: bool
) -> Any:
    """The training forward as every eager pass runs it: uint8 batch normalised on the device, then call(x) under
    the run's autocast (none when autocast_dtype is None)."""
    x = normalize(img, channels_last)
    with torch.autocast(x.device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        return call(x)


def feed_targets(net: nn.Module, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int]) -> None:
    """A train net whose forward needs the batch's targets (a DETR's denoising queries are noised ground truths)
    defines set_targets(targets, mask, imgsz); it gets them just before its training forward."""
    set_targets = getattr(getattr(net, "module", net), "set_targets", None)  # through a DDP wrapper
    if set_targets is not None:
        set_targets(targets, mask, imgsz)


class EagerStep:
    def __init__(
        self,
        net: nn.Module,
        loss_fn: LossFn,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        ema: ModelEMA | None,
        autocast_dtype: torch.dtype | None,
        grad_clip: float,
        batch_scale: float,
        channels_last: bool = False,
        flat: FlatParams | None = None,
    ):
        self.net, self.loss_fn, self.optimizer, self.scaler, self.ema = net, loss_fn, optimizer, scaler, ema
        self.autocast_dtype, self.grad_clip, self.batch_scale = autocast_dtype, grad_clip, batch_scale
        self.channels_last = channels_last
        self.flat = flat  # flat master weights + half stand-ins (engine/flat.py); None under DDP
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.grads_to_none = True  # graph runners keep .grad buffers alive (their graphs write into them)
        self.captures_loss = False
        self.captures = 0  # never captures: the graph runners count theirs
        self.skipped: torch.Tensor | None = None  # fp16 steps the scaler skipped (inf/NaN gradients), on device
        # DDP without its wrapper (the graph runners): averages the flat gradient buffer over ranks, in place, at
        # each accumulation boundary before the scaler looks at it, so every rank sees the same inf check
        self.grad_reduce: Callable[[torch.Tensor], None] | None = None
        # a micro-step's backward inside an accumulation window runs beside the next forward (engine/overlap.py);
        # the setup turns it on (components.overlap_wanted), never while a profiler times the phases
        self.overlap_backward = False
        self._pending = PendingBackward()

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        call = self.flat.forward if self.flat is not None else self.net
        return train_forward(call, img, self.autocast_dtype, self.channels_last)

    def __call__(
        self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases = NO_PHASES
    ) -> torch.Tensor:
        """img: uint8 (B, H, W, 3) on the device; returns the detached loss terms [box, cls, dfl]."""
        # DDP: inside an accumulation window gradients stay local; the boundary's backward all-reduces their sum once
        no_sync = getattr(self.net, "no_sync", None)
        with no_sync() if not boundary and no_sync is not None else contextlib.nullcontext():
            with phases("forward"):
                feed_targets(self.net, targets, mask, (img.shape[1], img.shape[2]))
                outputs = self.forward(img)
            with phases("loss"):
                loss, items = self.loss_fn(outputs, targets, mask, (img.shape[1], img.shape[2]), self.batch_scale)
            scaled = self.scaler.scale(loss)
            if self.overlap_backward and not boundary and phases is NO_PHASES:
                self._pending.start(lambda: self._backward(scaled))  # waits for the previous one first
            else:
                self._pending.wait()
                with phases("backward"):
                    self._backward(scaled)
        if boundary:
            self.update(phases)
        return items

    def _backward(self, scaled_loss: torch.Tensor) -> None:
        scaled_loss.backward()
        if self.flat is not None:
            self.flat.gather_grads()

    def update(self, phases: Phases = NO_PHASES) -> None:
        """The end of an accumulation window: optimizer step, then the EMA."""
        self._pending.wait()
        with phases("optimizer"):
            self.optimizer_step()
        with phases("ema"):
            if self.ema is not None:
                self.ema.update()

    def sync(self) -> None:
        """Before a checkpoint: an overlapped backward ends first."""
        self._pending.wait()

    def train_counters(self) -> TrainCounters:
        """torch's optimizer and the EMA keep their own counters (a fused AdamW's step is a device tensor already)."""
        return TrainCounters(self.optimizer.state_dict(), self.ema.updates if self.ema is not None else None)

    def invalidate(self, reason: str) -> None:
        """Nothing captured: the next step computes whatever the loss and network compute now."""
        self._pending.wait()

    def close(self) -> None:
        """Nothing captured: an overlapped backward ends."""
        self._pending.wait()

    def reload(self) -> None:
        """After weights were loaded into the parameters (resume): refresh what is derived from them."""
        self._pending.wait()
        if self.flat is not None:
            self.flat.refresh()

    def optimizer_step(self) -> None:
        if self.grad_reduce is not None:
            assert self.flat is not None  # set by the trainer only with flat gradients
            self.grad_reduce(self.flat.flat_grad)
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            if self.flat is not None:
                self.flat.clip_grad_norm_(self.grad_clip)
            else:
                torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        scale_before = (
            self.scaler._scale.clone() if self.scaler.is_enabled() and self.scaler._scale is not None else None
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if scale_before is not None:  # the scale only drops when the step was skipped
            assert self.scaler._scale is not None
            skipped = (self.scaler._scale < scale_before).int()
            self.skipped = skipped if self.skipped is None else self.skipped + skipped
        if self.flat is not None:
            self.flat.zero_grad()
            self.flat.refresh()
        else:
            self.optimizer.zero_grad(set_to_none=self.grads_to_none)
