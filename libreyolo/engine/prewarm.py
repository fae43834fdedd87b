"""The backward's first calls per layer shape, run while the warm-up's forward is still going.

A CUDA process's first backward of a detector took 0.65-1.05 s on the H200 against ~0.05 s warm: cuDNN loads
kernels and builds an execution plan on the first call per convolution shape (docs/performance.md). The forward
reaches the layers one by one, so each layer's shapes are known well before the forward ends. Hooks on the warm-up
copy's Conv2d and BatchNorm2d modules hand every new input shape to a helper thread, which runs that layer's
forward and backward once on constant tensors of the same shape, dtype and memory format. Its backward runs on
autograd's device thread, the thread whose plans the run's own backward passes use; kernels serve the whole
process. The helper's Python is a few calls per shape and its ops let go of the interpreter lock, so the forward
it runs beside hardly waits for it. Nothing random is drawn (the run's generators are left as they are) and
nothing is kept: the helper's tensors are dropped as it goes."""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

_Conv = tuple[tuple[int, ...], tuple[int, ...], bool, tuple[int, ...], Any, tuple[int, ...], int]
_Job = tuple[str, tuple[int, ...], torch.dtype, Any]


class LayerPrewarm:
    """watch(net) before a forward; finish() after it, to wait until every shape handed on has run. dtype: the
    convolutions' compute dtype (the autocast dtype, else float32); channels_last: the run's memory format."""

    def __init__(self, device: torch.device, dtype: torch.dtype, channels_last: bool):
        self.device, self.dtype = device, dtype
        self.fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.shapes = 0  # distinct layer shapes handed on
        self.error: BaseException | None = None  # the first failure (the run's own passes report real errors)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._seen: set[tuple[Any, ...]] = set()
        self._thread = threading.Thread(target=self._run, name="libreyolo-prewarm", daemon=True)
        self._thread.start()

    def watch(self, net: nn.Module) -> list[RemovableHandle]:
        """Forward pre-hooks on net's Conv2d and BatchNorm2d modules (plain, not subclasses); remove them after."""
        hooks = []
        for m in net.modules():
            if type(m) is nn.Conv2d and m.padding_mode == "zeros":
                hooks.append(m.register_forward_pre_hook(self._on_conv))
            elif type(m) is nn.BatchNorm2d:
                hooks.append(m.register_forward_pre_hook(self._on_norm))
        return hooks

    def finish(self) -> None:
        """Waits for the shapes handed on so far; the helper then ends."""
        self._queue.put(None)
        self._thread.join()

    def _hand_on(self, kind: str, x: torch.Tensor, rest: Any) -> None:
        key = (kind, tuple(x.shape), x.dtype, rest)
        if x.dim() == 4 and x.is_floating_point() and key not in self._seen:
            self._seen.add(key)
            self.shapes += 1
            self._queue.put((kind, tuple(x.shape), x.dtype, rest))

    def _on_conv(self, m: nn.Module, args: tuple[Any, ...]) -> None:
        assert isinstance(m, nn.Conv2d)
        w = m.weight
        padding = m.padding if isinstance(m.padding, str) else tuple(m.padding)
        rest = (tuple(w.shape), m.bias is not None, tuple(m.stride), padding, tuple(m.dilation), m.groups)
        self._hand_on("conv", args[0], rest)

    def _on_norm(self, m: nn.Module, args: tuple[Any, ...]) -> None:
        assert isinstance(m, nn.BatchNorm2d)
        self._hand_on("norm", args[0], (m.eps,))

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            if self.error is not None:
                continue
            try:
                self._once(*job)
            except Exception as e:  # noqa: BLE001  (recorded; a warm-up is worth no failure)
                self.error = e

    def _once(self, kind: str, shape: tuple[int, ...], dtype: torch.dtype, rest: Any) -> None:
        dev = self.device
        if kind == "conv":
            w_shape, bias, stride, padding, dilation, groups = rest
            # under autocast a float32 input is cast to the compute dtype, as here
            dt = self.dtype if dtype == torch.float32 else dtype
            x = torch.full(shape, 0.5, device=dev, dtype=dt).contiguous(memory_format=self.fmt).requires_grad_()
            w = torch.full(w_shape, 0.01, device=dev, dtype=dt).contiguous(memory_format=self.fmt).requires_grad_()
            b = torch.zeros(w_shape[0], device=dev, dtype=dt, requires_grad=True) if bias else None
            y = F.conv2d(x, w, b, stride, padding, dilation, groups)
        else:
            # BatchNorm keeps float32 weights and statistics under autocast, its input in the conv's dtype
            x = torch.full(shape, 0.5, device=dev, dtype=dtype).contiguous(memory_format=self.fmt).requires_grad_()
            c = shape[1]
            weight = torch.ones(c, device=dev, requires_grad=True)
            bias_ = torch.zeros(c, device=dev, requires_grad=True)
            mean, var = torch.zeros(c, device=dev), torch.ones(c, device=dev)
            y = F.batch_norm(x, mean, var, weight, bias_, True, 0.0, rest[0])
        y.backward(torch.ones_like(y))
