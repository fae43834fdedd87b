"""Exponential moving average of the weights (and float buffers), with the decay ramp d*(1-exp(-updates/tau))."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from libreyolo.nn.clone import clone


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.ema = clone(model).eval()  # copy.deepcopy, faster (nn/clone.py)
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        self._pairs(model)

    def _pairs(self, model: nn.Module) -> None:
        # the Parameter objects themselves, not .data snapshots: the trainer may move a parameter's storage
        # (engine/flat.py) after the EMA exists
        src = dict(model.state_dict(keep_vars=True))
        self._ema_t, self._src_t = [], []
        for k, v in self.ema.state_dict(keep_vars=True).items():
            if v.dtype.is_floating_point:  # integer buffers are not averaged
                self._ema_t.append(v)
                self._src_t.append(src[k])

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self) -> None:
        """One fused pass over all tensors (torch._foreach_lerp_) instead of a kernel per tensor."""
        self.updates += 1
        torch._foreach_lerp_(self._ema_t, self._src_t, 1.0 - self.current_decay())

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from libreyolo.engine.checkpoint import load_weights

        load_weights(self.ema, state["ema"], "EMA weights")
        self.updates = int(state["updates"])
