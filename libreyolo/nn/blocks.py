"""Convolution blocks of the GELAN family (YOLOv9): Conv, RepConvN, RepNCSP, RepNCSPELAN4, ELAN1, ADown, SPPELAN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from libreyolo.nn.streams import branches, forking

# torch's process-wide module hooks (registered by torch.nn.modules.module.register_module_forward_hook & co.)
_GLOBAL_HOOKS = (
    _module._global_backward_pre_hooks,
    _module._global_backward_hooks,
    _module._global_forward_pre_hooks,
    _module._global_forward_hooks,
)


def autopad(k: int, p: int | None = None, d: int = 1) -> int:
    """'same' padding for odd kernels."""
    if p is not None:
        return p
    return d * (k - 1) // 2


def batch_norm(c: int) -> nn.BatchNorm2d:
    """BatchNorm with the YOLO references' eps/momentum (statistics follow the data quickly at small batch).

    num_batches_tracked only matters when momentum is None; dropping it removes one kernel per BN layer
    from every training forward (about 240 launches per step for YOLOv9-t)."""
    bn = nn.BatchNorm2d(c, eps=1e-3, momentum=0.03)
    bn.num_batches_tracked = None
    return bn


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm + SiLU."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn = batch_norm(c2)
        # not in place: autograd would have to clone the input of an in-place SiLU for its backward anyway
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self._modules
        conv, bn, act = m["conv"], m["bn"], m["act"]
        if not _inline(conv, bn, act):
            return act(bn(conv(x)))
        # what nn.Conv2d, nn.BatchNorm2d (running statistics, no batch counter) and nn.SiLU compute, called as
        # the functions their forwards end in: three module calls and BatchNorm's Python checks less per layer
        # (about 240 Conv layers run per YOLOv9-t step; the step is host-bound on a GPU)
        p, b = conv._parameters, bn._parameters
        y = F.conv2d(x, p["weight"], p["bias"], conv.stride, conv.padding, conv.dilation, conv.groups)
        if bn.training and y.shape[0] * y.shape[2] * y.shape[3] == 1:
            return act(bn(y))  # BatchNorm's own error: one value per channel
        y = torch.batch_norm(
            y,
            b["weight"],
            b["bias"],
            bn._buffers["running_mean"],
            bn._buffers["running_var"],
            bn.training,
            bn.momentum,
            bn.eps,
            torch.backends.cudnn.enabled,
        )
        return F.silu(y) if type(act) is nn.SiLU else y


def _plain(m: nn.Module) -> bool:
    """Calling m would run its class's forward and nothing else: no hooks of its own, no forward patched on it."""
    return not (
        m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or m._backward_pre_hooks
        or "forward" in m.__dict__
    )


def _inline(conv: nn.Module, bn: nn.Module, act: nn.Module) -> bool:
    """Whether Conv may compute conv -> bn -> act as functions: exactly these torch classes (not SyncBatchNorm, which
    DDP swaps in, nor a subclass), BatchNorm tracking running statistics with a fixed momentum and no batch counter
    (batch_norm() below), nothing hooked, no tracing (which records module scopes)."""
    return (
        type(conv) is nn.Conv2d
        and type(bn) is nn.BatchNorm2d
        and type(act) in (nn.SiLU, nn.Identity)
        and conv.padding_mode == "zeros"
        and bn.track_running_stats
        and bn.momentum is not None
        and bn._buffers.get("num_batches_tracked") is None
        and bn._buffers["running_mean"] is not None
        and not (type(act) is nn.SiLU and act.inplace)
        and _plain(conv)
        and _plain(bn)
        and _plain(act)
        and not any(_GLOBAL_HOOKS)
        and not torch._C._get_tracing_state()
    )


class RepConvN(nn.Module):
    """Re-parameterisable conv: a 3x3 and a 1x1 branch (each with BN) summed, then SiLU."""

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1):
        super().__init__()
        self.conv1 = Conv(c1, c2, k, s, act=False)
        self.conv2 = Conv(c1, c2, 1, s, p=0, act=False)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if forking(x):  # captured: the 1x1 branch beside the 3x3 one (nn/streams.py)
            a, b = branches([x], lambda: self.conv1(x), lambda: self.conv2(x))
            return self.act(a + b)
        return self.act(self.conv1(x) + self.conv2(x))


class RepNBottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True, e: float = 1.0):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = RepConvN(c1, c_, 3, 1)
        self.cv2 = Conv(c_, c2, 3, 1)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepNCSP(nn.Module):
    """CSP block whose bottlenecks are RepNBottlenecks."""

    def __init__(self, c1: int, c2: int, n: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(RepNBottleneck(c_, c_) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if forking(x):  # captured: cv2 beside the bottleneck chain (nn/streams.py)
            return self.cv3(torch.cat(branches([x], lambda: self.m(self.cv1(x)), lambda: self.cv2(x)), 1))
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class _ELAN(nn.Module):
    """Split cv1's output in two, run the second half through two chained stages, concatenate all four."""

    cv1: nn.Module
    cv2: nn.Module
    cv3: nn.Module
    cv4: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        c = self.cv2(b)
        d = self.cv3(c)
        return self.cv4(torch.cat((a, b, c, d), 1))


class RepNCSPELAN4(_ELAN):
    """GELAN block: each stage is a RepNCSP followed by a 3x3 Conv."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, n: int = 1):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = nn.Sequential(RepNCSP(c3 // 2, c4, n), Conv(c4, c4, 3, 1))
        self.cv3 = nn.Sequential(RepNCSP(c4, c4, n), Conv(c4, c4, 3, 1))
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)


class ELAN1(_ELAN):
    """The light ELAN stage of the smallest GELAN models: plain 3x3 Convs as stages."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = Conv(c3 // 2, c4, 3, 1)
        self.cv3 = Conv(c4, c4, 3, 1)
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)


class ADown(nn.Module):
    """Stride-2 downsampling: average-pool, then half the channels by a 3x3/s2 conv, half by max-pool + 1x1."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        c = c2 // 2
        self.cv1 = Conv(c1 // 2, c, 3, 2, 1)
        self.cv2 = Conv(c1 // 2, c, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(x, 2, 1, 0, False, True)
        x1, x2 = x.chunk(2, 1)
        if forking(x):  # captured: the max-pool half beside the conv half (nn/streams.py)
            return torch.cat(branches([x], lambda: self.cv1(x1), lambda: self.cv2(F.max_pool2d(x2, 3, 2, 1))), 1)
        return torch.cat((self.cv1(x1), self.cv2(F.max_pool2d(x2, 3, 2, 1))), 1)


class SPPELAN(nn.Module):
    """Spatial pyramid pooling (three chained 5x5 max-pools) in ELAN form."""

    def __init__(self, c1: int, c2: int, c3: int, k: int = 5):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)
        self.cv5 = Conv(4 * c3, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv5(torch.cat(y, 1))
