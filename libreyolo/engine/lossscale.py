"""The float16 loss scale a run starts with, read off its first batch instead of GradScaler's fixed 65,536.

GradScaler starts at 2**16 and halves the scale after each optimizer step whose gradients overflowed, skipping
that step. YOLO losses are summed over the batch (and multiplied by it: families/yolo9/loss.py), so their
gradients are large: a 15-epoch run of 800 images at batch 16 lost 10-11 of its first ~12 optimizer steps
while the scale fell from 65,536 to 32 (H200, docs/performance.md). Here, before the first step, one forward
and a few backward passes of the first batch (torch.autograd.grad: nothing is accumulated, the optimizer
never sees them) find the largest power of two at which every float16 gradient is finite; the run starts one
halving below it, so the first steps are not skipped. Later overflows still back the scale off and are
counted as before. BatchNorm buffers are restored afterwards, so the probe leaves no trace in the weights."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

MAX_EXP = 24  # 2**24: far above any scale a real network's gradients fit under in float16
MARGIN_EXP = 1  # start one halving below the largest finite scale: gradients grow early in training


def largest_finite_exp(finite_at: Callable[[int], bool], hi: int = MAX_EXP) -> int | None:
    """The largest e in [0, hi] with finite_at(e), by bisection (overflow is monotone in the scale); None if
    even a scale of 1 overflows."""
    if not finite_at(0):
        return None
    lo = 0  # finite
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if finite_at(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def probe_loss_scale(net: nn.Module, forward: Callable[[torch.Tensor], Any], loss_fn: Callable, inputs: list[torch.Tensor],
                     img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, batch_scale: float,
                     agree: Callable[[bool], bool] = lambda finite: finite) -> tuple[float, int | None]:
    """-> (the scale to start with, the largest finite exponent found). `forward(img)` runs the train net under
    the step's autocast; `inputs` are the tensors whose gradients the optimizer will see (the float16 weight
    stand-ins, or the parameters). Under DDP `agree` makes every rank take the same bisection path (finite on
    all ranks): SyncBatchNorm's backward is a collective, so the ranks must run the same backward passes."""
    buffers = [(b, b.clone()) for b in net.buffers()]
    try:
        outputs = forward(img)
        loss, _ = loss_fn(outputs, targets, mask, (img.shape[1], img.shape[2]), batch_scale)

        def finite_at(e: int) -> bool:
            grads = torch.autograd.grad(loss * float(2**e), inputs, retain_graph=True, allow_unused=True)
            flags = [torch.isfinite(g).all() for g in grads if g is not None]
            return agree(bool(torch.stack(flags).all()) if flags else True)

        exp = largest_finite_exp(finite_at)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    if exp is None:
        return 1.0, None
    return float(2 ** max(exp - MARGIN_EXP, 0)), exp


def set_start_scale(scaler: torch.amp.GradScaler, scale: float) -> None:
    """Before the first optimizer step: the scaler's scale tensor if it exists (whole-step capture creates it
    early), else the value it will be created with."""
    if getattr(scaler, "_scale", None) is not None:
        scaler._scale.fill_(scale)
    else:
        scaler._init_scale = scale
