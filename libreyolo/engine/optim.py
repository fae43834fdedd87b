"""Optimizer construction and the default LR schedule. A family may bring its own parameter groups and schedule
(Family.param_groups, Family.schedule); the default is the Ultralytics layout: biases, weights, norm weights."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.families import RunKeys

FUSED_DEVICES = ("cuda", "cpu")  # where torch's fused SGD and AdamW run


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    """-> biases (pg0, no decay, warm-up from warmup_bias_lr), weights (pg1, decay), normalisation weights (pg2,
    no decay). A group is {"params", "decay": bool, "bias": bool}; what a family's param_groups hook returns too,
    optionally with "lr_scale" (the group's LR as a fraction of lr0; schedules scale from its initial_lr)."""
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
    return [
        {"params": biases, "decay": False, "bias": True},
        {"params": weights, "decay": True},
        {"params": norm, "decay": False},
    ]


def skip_dynamo_import() -> None:
    """Let torch.optim's bookkeeping methods run without importing torch._dynamo.

    torch.optim wraps Optimizer.add_param_group, zero_grad, state_dict and load_state_dict in
    torch._disable_dynamo, which imports torch._dynamo (and with it sympy, torch.fx's symbolic shapes and the
    inductor's rules) the first time any of them is called, to exclude them from torch.compile: a few seconds at
    the start of every run (docs/performance.md). Nothing here compiles an optimizer, so each wrapper is given
    its plain function as the cached "disabled" version, the cache _disable_dynamo fills itself once dynamo is
    loaded. Not when dynamo is loaded already (someone compiles in this process: their exclusion stays as torch
    made it), and a torch whose wrapper is not the one recognised here is left alone. Optimizer.step imports
    dynamo itself: plain_step() below."""
    if "torch._dynamo" in sys.modules:
        return
    probe = torch._disable_dynamo(lambda: None)  # type: ignore[attr-defined]
    for attr in vars(torch.optim.Optimizer).values():
        plain = getattr(attr, "__wrapped__", None)
        if getattr(attr, "__code__", None) is probe.__code__ and plain is not None:
            if getattr(plain, "__dynamo_disable", None) is None:
                setattr(plain, "__dynamo_disable", plain)


def plain_step(opt: torch.optim.Optimizer) -> None:
    """Give this optimizer a step() without the two wrappers torch.optim puts around its update: the profiler
    hook (a record_function and the step hooks, of which none is registered here) and _use_grad, which imports
    torch._dynamo on its first call, to mark graph breaks for torch.compile, and turns gradients off. The
    replacement turns gradients off itself; GradScaler and the eager and `true` steps call it as before. Not
    for a differentiable optimizer, not once dynamo is loaded, and not where the wrappers are not the ones
    recognised here (another torch): those keep torch's step."""
    if "torch._dynamo" in sys.modules or opt.defaults.get("differentiable"):
        return
    hooked = type(opt).step
    use_grad = getattr(hooked, "__wrapped__", None)
    update = getattr(use_grad, "__wrapped__", None)
    names = (getattr(hooked, "__code__", None), getattr(use_grad, "__code__", None))
    if update is None or [getattr(c, "co_name", None) for c in names] != ["wrapper", "_use_grad"]:
        return

    def step(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return update(opt, *args, **kwargs)

    opt.step = step  # type: ignore[method-assign]


def resolve_optimizer(cfg: TrainConfig, nc: int, iterations: int) -> tuple[str, float, float]:
    """auto: SGD for long schedules (> 10k optimizer steps), else AdamW at a class-count-fitted LR (as Ultralytics)."""
    if cfg.optimizer != "auto":
        return cfg.optimizer, cfg.lr0, cfg.momentum
    if iterations > 10_000:
        return "SGD", 0.01, 0.9
    return "AdamW", round(0.002 * 5 / (4 + nc), 6), 0.9


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    momentum: float,
    decay: float,
    device: torch.device,
    groups: Callable[[nn.Module], list[dict[str, Any]]] | None = None,
) -> torch.optim.Optimizer:
    """groups: the family's param_groups hook (default: param_groups above); `decay` applies to groups marked so."""
    spec = (groups or param_groups)(model)
    plain = [
        {
            "params": g["params"],
            "weight_decay": decay if g.get("decay") else 0.0,
            "bias": bool(g.get("bias")),
            "lr_scale": float(g.get("lr_scale", 1.0)),
        }
        for g in spec
    ]
    # fused implementations (CUDA, CPU): the whole update of a group in one multi-tensor kernel, and GradScaler
    # hands them found_inf on the device instead of reading it on the host (a synchronisation per optimizer step
    # with the foreach implementations, which step() only when that read says the gradients are finite)
    skip_dynamo_import()
    fused = device.type in FUSED_DEVICES
    kw: dict[str, Any] = {"fused": True} if fused else {"foreach": True}
    opt: torch.optim.Optimizer
    if name == "SGD":
        opt = torch.optim.SGD(plain, lr=lr, momentum=momentum, nesterov=True, **kw)
        if fused:
            # fused SGD creates its momentum buffers uninitialised on its first step and fills them in the kernel,
            # which a skipped step (float16 inf/NaN gradients) never runs: start them at zero, as capturable.py does
            # (a first step then gives buf = 0 * momentum + grad = grad, exactly what torch's initialisation gives)
            for g in opt.param_groups:
                for p in g["params"]:
                    opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    elif name == "AdamW":
        opt = torch.optim.AdamW(plain, lr=lr, betas=(momentum, 0.999), **kw)
    else:
        raise ValueError(f"optimizer {name!r}: use SGD, AdamW or auto")
    for g in opt.param_groups:
        g["initial_lr"] = lr * g["lr_scale"]  # a family's group may train slower (RT-DETR's backbone: x0.1)
    plain_step(opt)
    return opt


def reported_lr(opt: torch.optim.Optimizer) -> float:
    """The LR a progress line shows: that of the group holding the most weights."""
    return max(opt.param_groups, key=lambda g: sum(p.numel() for p in g["params"]))["lr"]


def lr_factor(epoch: float, epochs: int, lrf: float, cosine: bool) -> float:
    """Multiplier of the initial LR at (fractional) epoch: linear or cosine from 1 down to lrf."""
    x = min(epoch / max(epochs, 1), 1.0)
    if cosine:
        return ((1 - math.cos(x * math.pi)) / 2) * (lrf - 1) + 1
    return (1 - x) * (1.0 - lrf) + lrf


def apply_schedule(
    optimizer: torch.optim.Optimizer,
    cfg: RunKeys,
    epoch: int,
    ni: int,
    warmup_iters: int,
    momentum: float,
    steps_per_epoch: int = 0,
) -> None:
    """Set each group's LR (and momentum during warm-up) for global iteration ni of epoch."""
    target = lr_factor(epoch, cfg.epochs, cfg.lrf, cfg.cos_lr)
    for g in optimizer.param_groups:
        lr = g["initial_lr"] * target
        if ni < warmup_iters:
            # biases fall from warmup_bias_lr, the other groups rise from 0
            lr = float(np.interp(ni, [0, warmup_iters], [cfg.warmup_bias_lr if g.get("bias") else 0.0, lr]))
            m = float(np.interp(ni, [0, warmup_iters], [cfg.warmup_momentum, momentum]))
            if "momentum" in g:
                g["momentum"] = m
            elif "betas" in g:
                g["betas"] = (m, g["betas"][1])
        g["lr"] = lr
