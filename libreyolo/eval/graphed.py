"""Validation's forward and loss for one static batch shape in a CUDA graph.

The eager forward of a small detector is host-bound: on the H200, validating 200 images of 640 px spent more
time launching the network's kernels than running them. Inside training the validated network is the EMA copy,
whose weights and BatchNorm statistics are updated in place, so a graph captured at the first validation stays
valid for every later one and is replayed batch by batch. Targets are padded to a fixed capacity (the most
labels any validation image has); a batch of another shape, or with more labels, runs eagerly; if the capture
fails, validation stays eager and `error` says why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from libreyolo.nn import streams


class EvalGraph:
    def __init__(self, net: nn.Module, loss_fn: Callable | None, autocast_dtype: torch.dtype | None, capacity: int):
        self.net, self.loss_fn, self.autocast_dtype, self.capacity = net, loss_fn, autocast_dtype, capacity
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.error: str | None = None
        self.replays = 0
        # a loss that synchronises with the host (a DETR's Hungarian matching) says so with `capturable = False`:
        # the graph then holds the network only and the loss runs eagerly on its outputs
        self.loss_in_graph = loss_fn is not None and getattr(loss_fn, "capturable", True)

    def invalidate(self) -> None:
        """What the loss computes changed (a family hook): capture anew at the next validation."""
        self.graph, self.key = None, None

    def _body(
        self, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], loss: bool = True
    ) -> tuple[Any, torch.Tensor | None]:
        # the autocast weight-cast cache must not outlive a capture: the casts are captured kernels
        with torch.autocast(
            x.device.type,
            dtype=self.autocast_dtype or torch.float32,
            enabled=self.autocast_dtype is not None,
            cache_enabled=False,
        ):
            raw = self.net(x)
        items = self.loss_fn(raw, targets, mask, imgsz, 1.0)[1] if self.loss_fn is not None and loss else None
        return raw, items

    @torch.no_grad()
    def __call__(
        self, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int]
    ) -> tuple[Any, torch.Tensor | None]:
        """-> (what the network returns, the detached loss terms or None). Outputs of a replay are the graph's own
        buffers: read them before the next call."""
        if x.device.type != "cuda" or self.error is not None or targets.shape[1] > self.capacity:
            return self._body(x, targets, mask, imgsz)
        extra = self.capacity - targets.shape[1]
        if extra:
            targets = torch.nn.functional.pad(targets, (0, 0, 0, extra))
            mask = torch.nn.functional.pad(mask, (0, extra))
        key = (tuple(x.shape), x.dtype, x.stride(), imgsz)
        if self.graph is None:
            try:
                self._capture(key, x, targets, mask, imgsz)
            except Exception as e:  # validation must never fail for the graph's sake
                self.graph, self.error = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                return self._body(x, targets, mask, imgsz)
        if key != self.key:
            return self._body(x, targets, mask, imgsz)
        self.x.copy_(x)
        self.targets.copy_(targets)
        self.mask.copy_(mask)
        self.graph.replay()
        self.replays += 1
        if self.loss_fn is not None and not self.loss_in_graph:
            return self.raw, self.loss_fn(self.raw, targets, mask, imgsz, 1.0)[1]
        return self.raw, self.items

    def _capture(
        self, key: tuple, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int]
    ) -> None:
        # warm-up on a side stream first (cuDNN and cuBLAS set themselves up outside the capture)
        with streams.on_warmup_stream(x.device, "val"):
            self._body(x, targets, mask, imgsz, self.loss_in_graph)
        self.x, self.targets, self.mask = x.clone(), targets.clone(), mask.clone()
        graph = torch.cuda.CUDAGraph()
        with streams.capture(graph, capture_error_mode="thread_local"):
            self.raw, self.items = self._body(self.x, self.targets, self.mask, imgsz, self.loss_in_graph)
        self.graph, self.key = graph, key
