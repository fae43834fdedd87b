"""One training step in named phases: forward -> loss -> backward [-> optimizer -> ema at accumulation boundaries].

The data and to_device phases belong to the loop (trainer.py). The profiler and the CUDA-graph manager hook
these names; `phases` is a no-op object unless the profiler swaps in its own for its window."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from libreyolo.engine.ema import ModelEMA

PHASES = ("data", "to_device", "forward", "loss", "backward", "optimizer", "ema")


class NoPhases:
    """The default: entering a phase costs one attribute lookup and a shared null context."""

    _null = contextlib.nullcontext()

    def __call__(self, name: str) -> ContextManager:
        return self._null


NO_PHASES = NoPhases()


class EagerStep:
    def __init__(
        self,
        net: nn.Module,
        loss_fn: Callable,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        ema: ModelEMA | None,
        autocast_dtype: torch.dtype | None,
        grad_clip: float,
        batch_scale: float,
    ):
        self.net, self.loss_fn, self.optimizer, self.scaler, self.ema = net, loss_fn, optimizer, scaler, ema
        self.autocast_dtype, self.grad_clip, self.batch_scale = autocast_dtype, grad_clip, batch_scale
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.skipped: torch.Tensor | None = None  # fp16 steps the scaler skipped (inf/NaN gradients), on device

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast(x.device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None):
            return self.net(x)

    def __call__(self, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Any = NO_PHASES) -> torch.Tensor:
        with phases("forward"):
            outputs = self.forward(x)
        with phases("loss"):
            loss, items = self.loss_fn(outputs, targets, mask, (x.shape[2], x.shape[3]), self.batch_scale)
        with phases("backward"):
            self.scaler.scale(loss).backward()
        if boundary:
            with phases("optimizer"):
                self.optimizer_step()
            with phases("ema"):
                if self.ema is not None:
                    self.ema.update()
        return items

    def optimizer_step(self) -> None:
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        scale_before = self.scaler._scale.clone() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if scale_before is not None:  # the scale only drops when the step was skipped
            skipped = (self.scaler._scale < scale_before).int()
            self.skipped = skipped if self.skipped is None else self.skipped + skipped
        self.optimizer.zero_grad(set_to_none=True)
