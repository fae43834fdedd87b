"""Optimizer construction (three parameter groups, as the Ultralytics results columns expect) and LR schedule."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn


def param_groups(model: nn.Module) -> tuple[list, list, list]:
    """-> biases (pg0, no decay), weights (pg1, decay), normalisation weights (pg2, no decay)."""
    biases, weights, norm = [], [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if name == "bias":
                biases.append(p)
            elif isinstance(module, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)):
                norm.append(p)
            else:
                weights.append(p)
    return biases, weights, norm


def resolve_optimizer(cfg: Any, nc: int, iterations: int) -> tuple[str, float, float]:
    """auto: SGD for long schedules (> 10k optimizer steps), else AdamW at a class-count-fitted LR (as Ultralytics)."""
    if cfg.optimizer != "auto":
        return cfg.optimizer, cfg.lr0, cfg.momentum
    if iterations > 10_000:
        return "SGD", 0.01, 0.9
    return "AdamW", round(0.002 * 5 / (4 + nc), 6), 0.9


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, decay: float, device: torch.device) -> torch.optim.Optimizer:
    biases, weights, norm = param_groups(model)
    # foreach implementations: one launch per group per op instead of one per tensor
    kw: dict[str, Any] = {"foreach": True}
    if name == "SGD":
        opt = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True, **kw)
    elif name == "AdamW":
        opt = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, **kw)
    else:
        raise ValueError(f"optimizer {name!r}: use SGD, AdamW or auto")
    opt.add_param_group({"params": weights, "weight_decay": decay})
    opt.add_param_group({"params": norm, "weight_decay": 0.0})
    for g in opt.param_groups:
        g["initial_lr"] = lr
    return opt


def lr_factor(epoch: float, epochs: int, lrf: float, cosine: bool) -> float:
    """Multiplier of the initial LR at (fractional) epoch: linear or cosine from 1 down to lrf."""
    x = min(epoch / max(epochs, 1), 1.0)
    if cosine:
        return ((1 - math.cos(x * math.pi)) / 2) * (lrf - 1) + 1
    return (1 - x) * (1.0 - lrf) + lrf


def apply_schedule(opt: torch.optim.Optimizer, cfg: Any, epoch: int, ni: int, warmup_iters: int, momentum: float) -> None:
    """Set each group's LR (and momentum during warm-up) for global iteration ni of epoch."""
    target = lr_factor(epoch, cfg.epochs, cfg.lrf, cfg.cos_lr)
    for j, g in enumerate(opt.param_groups):
        lr = g["initial_lr"] * target
        if ni < warmup_iters:
            # biases (pg0) fall from warmup_bias_lr, the other groups rise from 0
            lr = float(np.interp(ni, [0, warmup_iters], [cfg.warmup_bias_lr if j == 0 else 0.0, lr]))
            m = float(np.interp(ni, [0, warmup_iters], [cfg.warmup_momentum, momentum]))
            if "momentum" in g:
                g["momentum"] = m
            elif "betas" in g:
                g["betas"] = (m, g["betas"][1])
        g["lr"] = lr
