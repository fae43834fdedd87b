"""The float16 loss scale a run starts with, read off its first batch instead of GradScaler's fixed 65,536.

GradScaler starts at 2**16 and halves the scale after each optimizer step whose gradients overflowed, skipping
that step. YOLO losses are summed over the batch (and multiplied by it: families/yolo9/loss.py), so their
gradients are large: a 15-epoch run of 800 images at batch 16 lost 10-11 of its first ~12 optimizer steps
while the scale fell from 65,536 to 32 (H200, docs/performance.md). Here, before the first step, one forward
and (usually) three backward passes of the first batch (torch.autograd.grad: nothing is accumulated, the optimizer
never sees them) find the largest power of two at which every float16 gradient is finite; the run starts one
halving below it, so the first steps are not skipped. The setup's kernel warm-up runs them on its copy of the
train net, the backward passes in its thread (engine/warmup.py); a run without that warm-up (DDP, cuDNN's
algorithm timing on) runs them on the train net at its first step. The gradients' peaks at scale 1 (weights, and every
module's float16 output) give the first guess, usually decided by the passes just above and below it. Later
overflows still back the scale off and are counted as before. BatchNorm buffers are restored afterwards, so the
probe leaves no trace in the weights."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from libreyolo.distributed.context import DistContext
from libreyolo.engine.step import EagerStep
from libreyolo.families.base import LossFn
from libreyolo.nn.inputs import normalize

MAX_EXP = 24  # 2**24: far above any scale a real network's gradients fit under in float16
FP16_MAX = 65504.0
MARGIN_EXP = 1  # start one halving below the largest finite scale: gradients grow early in training


def largest_finite_exp(
    finite_at: Callable[[int], bool], hi: int = MAX_EXP, guess: Callable[[], int] | None = None
) -> int | None:
    """The largest e in [0, hi] with finite_at(e), by bisection (overflow is monotone in the scale); None if
    even a scale of 1 overflows. guess(), asked after the check at 0, narrows the search first: when finite_at
    (guess) holds and finite_at(guess + 1) does not, two checks decide it."""
    if not finite_at(0):
        return None
    lo = 0  # finite
    if guess is not None:
        g = min(max(guess(), 0), hi)
        if g > 0 and finite_at(g):
            lo = g
            if g == hi or not finite_at(g + 1):
                return g
            lo = g + 1
        elif g > 0:
            hi = g - 1
    return bisect_largest(finite_at, lo, hi)


def bisect_largest(finite_at: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest e in [lo, hi] with finite_at(e), given finite_at(lo) (overflow is monotone in the scale)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if finite_at(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class ScaleSearch:
    """The largest power of two at which a loss's float16 gradients stay finite. watch(net) before the forward:
    each module's float16 output then records its gradient's peak during the first backward (at scale 1), which
    gives search() its first guess. search(loss, inputs) runs the backward passes (torch.autograd.grad: nothing
    is accumulated) on whichever thread calls it. Under DDP `agree` makes every rank take the same bisection path
    (finite on all ranks): SyncBatchNorm's backward is a collective, so the ranks must run the same passes."""

    def __init__(
        self,
        agree: Callable[[bool], bool] = lambda finite: finite,
        agree_min: Callable[[float], float] = lambda x: x,
    ):
        self.agree, self.agree_min = agree, agree_min
        # float16 overflows first in activation gradients, which the optimizer never sees
        self._act_peaks: list[torch.Tensor] = []
        # removed after the first backward: the later passes would otherwise take the interpreter lock on autograd's
        # thread once per hooked tensor, for nothing
        self._tensor_hooks: list[RemovableHandle] = []

    def watch(self, net: nn.Module) -> list[RemovableHandle]:
        """Forward hooks on every module of net; remove them once the forward has run."""

        hooked: set[int] = set()

        def record(g: torch.Tensor) -> None:  # one kernel: max |g| (inf or NaN if any element is)
            self._act_peaks.append(torch.linalg.vector_norm(g.detach(), math.inf))

        def on_output(_module: nn.Module, _inputs: Any, out: Any) -> None:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                # a container passes its last child's output on: one hook per tensor
                if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype == torch.float16 and id(t) not in hooked:
                    hooked.add(id(t))
                    self._tensor_hooks.append(t.register_hook(record))

        return [m.register_forward_hook(on_output) for m in net.modules()]

    def search(self, loss: torch.Tensor, inputs: list[torch.Tensor]) -> int | None:
        """-> the largest finite exponent, None if even a scale of 1 overflows. inputs: the tensors whose
        gradients the optimizer will see (the float16 weight stand-ins, or the parameters)."""
        peak: list[float] = []

        def finite_at(e: int) -> bool:
            grads = [
                g
                for g in torch.autograd.grad(loss * float(2**e), inputs, retain_graph=True, allow_unused=True)
                if g is not None
            ]
            for h in self._tensor_hooks:
                h.remove()
            self._tensor_hooks.clear()
            if not grads:
                return self.agree(True)
            # the largest |gradient|: one multi-tensor kernel (an inf or NaN anywhere makes it non-finite)
            top = torch.stack([n.float() for n in torch._foreach_norm(grads, math.inf)]).amax()
            if e == 0 and self._act_peaks:
                top = torch.maximum(top, torch.stack(self._act_peaks).amax().float())
            top_v = top.item()  # one host read per pass
            if e == 0:
                peak.append(top_v)
            return self.agree(math.isfinite(top_v))

        def guess() -> int:
            """The exponent at which the largest gradient seen at scale 1 (weights and module outputs) would just
            stay under float16's max: agreed by every rank (the smallest)."""
            top = peak[0] if peak else 0.0
            e = int(math.floor(math.log2(FP16_MAX / top))) if top > 0 else MAX_EXP
            return int(self.agree_min(e))

        return largest_finite_exp(finite_at, guess=guess)


def start_scale(exp: int | None) -> float:
    """The scale a run starts with, one halving below the largest finite one (1 when even 1 overflows)."""
    return 1.0 if exp is None else float(2 ** max(exp - MARGIN_EXP, 0))


def scale_reason(scale: float, exp: int | None) -> str:
    found = f"finite up to 2^{exp}" if exp is not None else "not finite even at scale 1"
    return f"loss scale starts at {scale:g}: the first batch's float16 gradients are {found}"


def probe_loss_scale(
    net: nn.Module,
    forward: Callable[[torch.Tensor], Any],
    loss_fn: LossFn,
    inputs: list[torch.Tensor],
    img: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    batch_scale: float,
    agree: Callable[[bool], bool] = lambda finite: finite,
    agree_min: Callable[[float], float] = lambda x: x,
) -> tuple[float, int | None]:
    """-> (the scale to start with, the largest finite exponent found). `forward(img)` runs the train net under
    the step's autocast; `inputs` as for ScaleSearch.search. BatchNorm buffers are restored afterwards."""
    buffers = [(b, b.clone()) for b in net.buffers()]
    probe = ScaleSearch(agree, agree_min)
    hooks = probe.watch(net)
    try:
        try:
            outputs = forward(img)
        finally:
            for h in hooks:
                h.remove()
        loss, _ = loss_fn(outputs, targets, mask, (img.shape[1], img.shape[2]), batch_scale)
        exp = probe.search(loss, inputs)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return start_scale(exp), exp


def set_start_scale(scaler: torch.amp.GradScaler, scale: float) -> None:
    """Before the first optimizer step: the scaler's scale tensor if it exists (whole-step capture creates it
    early), else the value it will be created with."""
    current = getattr(scaler, "_scale", None)  # absent on a disabled scaler
    if current is not None:
        current.fill_(scale)
    else:
        scaler._init_scale = scale


def start_loss_scale(
    e: EagerStep,
    train_net: nn.Module,
    scaler: torch.amp.GradScaler,
    dist: DistContext,
    device: torch.device,
    img: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[float, str]:
    """float16: start the run's scaler at the largest loss scale the first batch's gradients fit under, the same
    on every rank, instead of losing the first optimizer steps to GradScaler's back-off. -> (scale, why). The
    setup's kernel warm-up usually reads it off the same batch first (engine/warmup.py); this runs where it did
    not (DDP, cuDNN timing on, a resumed run's hook)."""
    forward: Callable[[torch.Tensor], object]
    if e.flat is not None:
        forward, inputs = e.forward, list(e.flat.proxies.values())
    else:  # DDP: probe the plain module (the DDP wrapper expects its own backward)

        def plain_forward(x: torch.Tensor) -> object:
            with torch.autocast(x.device.type, dtype=e.autocast_dtype):
                return train_net(normalize(x, e.channels_last))

        forward = plain_forward
        inputs = [p for p in train_net.parameters() if p.requires_grad]
    scale, exp = probe_loss_scale(
        train_net,
        forward,
        e.loss_fn,
        inputs,
        img,
        targets,
        mask,
        e.batch_scale,
        agree=lambda finite: dist.min(float(finite), device) > 0,
        agree_min=lambda x: dist.min(x, device),
    )
    set_start_scale(scaler, scale)
    return scale, scale_reason(scale, exp)
