"""cuda_graph=True: the network's forward and backward (or the capture plan's submodules) replayed from CUDA graphs,
with the loss, the optimizer step, clipping, the EMA and the LR schedule eager. Shape counting, step-down and pools:
graphs.py's GraphRunner."""

from __future__ import annotations

from collections.abc import Callable

import torch

from libreyolo import events as ev
from libreyolo.engine.graphs import GraphRunner, Shape
from libreyolo.engine.step import EagerStep, Phases
from libreyolo.engine.subgraphs import CapturedParts, SubmoduleGraphs
from libreyolo.families import WHOLE_NET, CapturePlan
from libreyolo.nn import streams


class _NetGraph:
    """Forward and backward graphs of one input shape, sharing a private memory pool."""

    def __init__(self) -> None:
        self.fwd, self.bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.x = torch.empty(0)  # the static input, made by capture()
        self.outs: tuple[torch.Tensor, ...] = ()
        self.grad_outs: list[torch.Tensor] = []
        self.single = False  # the network returns one tensor, not a tuple


class NetworkGraphStep(GraphRunner["_NetGraph | CapturedParts"]):
    """cuda_graph=True: what the family's capture plan names in forward and backward graphs (for YOLOv9 the whole
    train net, auxiliary head included; or a list of submodules, subgraphs.py, with the rest eager); the loss,
    the optimizer step, clipping, the EMA and the LR schedule stay eager."""

    mode = "network"

    def __init__(
        self, eager: EagerStep, emit: Callable[[ev.Event], None], device: torch.device, plan: CapturePlan = WHOLE_NET
    ):
        super().__init__(eager, emit, device)
        self.parts = None if plan.whole_net else SubmoduleGraphs(eager, plan.modules)

    def describe(self, key: Shape) -> str:
        if self.parts is not None:
            return f"the forward and backward of {', '.join(self.parts.names)} (the rest eager)"
        return super().describe(key)

    def capture(
        self, key: Shape, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool
    ) -> _NetGraph | CapturedParts:
        # a pool per shape: graphs of two shapes may replay in any order, and one shape's outputs outlive its replay
        pool = self.new_pool()
        if self.parts is not None:
            return self.parts.capture(img, pool.handle)
        e = self.eager
        # the backward graph accumulates into .grad in place, so the buffers must exist and never be freed:
        # real gradient accumulation over micro-batches (nbs) then works as in eager mode
        for p in e.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        e.grads_to_none = False
        g = _NetGraph()
        g.x = torch.empty(
            img.shape[0],
            3,
            img.shape[1],
            img.shape[2],
            device=img.device,
            memory_format=torch.channels_last if e.channels_last else torch.contiguous_format,
        )
        # thread-local error mode: the loaders' threads (training staging, validation pinning) may allocate host memory
        with streams.capture(g.fwd, pool=pool.handle, capture_error_mode="thread_local"):
            # the autocast weight-cast cache must not outlive the capture: casts are captured kernels
            with torch.autocast(
                "cuda",
                dtype=e.autocast_dtype or torch.float32,
                enabled=e.autocast_dtype is not None,
                cache_enabled=False,
            ):
                out = self.flat.forward(g.x)
        g.single = isinstance(out, torch.Tensor)  # the loss gets what the network returns: a tensor or a tuple
        g.outs = (out,) if g.single else tuple(out)
        g.grad_outs = [torch.empty_like(o) for o in g.outs]
        with streams.capture(g.bwd, pool=pool.handle, capture_error_mode="thread_local"):
            torch.autograd.backward(g.outs, grad_tensors=g.grad_outs)
            self.flat.gather_grads()
        # keep the output buffers, drop the captured autograd graph: its nodes would otherwise stay alive
        # (on the capture stream) and make later eager steps synchronise across streams
        g.outs = tuple(o.detach() for o in g.outs)
        return g

    def replay(
        self,
        g: _NetGraph | CapturedParts,
        img: torch.Tensor,
        targets: torch.Tensor,
        mask: torch.Tensor,
        boundary: bool,
        phases: Phases,
    ) -> torch.Tensor:
        if isinstance(g, dict):  # the capture plan's submodules: what self.parts captured
            assert self.parts is not None
            with self.parts.active(g):
                return self.eager(img, targets, mask, boundary, phases)
        e = self.eager
        with phases("forward"):
            g.x.copy_(img.permute(0, 3, 1, 2)).div_(255.0)
            g.fwd.replay()
        outs = tuple(o.detach().requires_grad_(True) for o in g.outs)
        with phases("loss"):
            loss, items = e.loss_fn(
                outs[0] if g.single else outs, targets, mask, (img.shape[1], img.shape[2]), e.batch_scale
            )
        with phases("backward"):
            e.scaler.scale(loss).backward()
            for dst, o in zip(g.grad_outs, outs):
                assert o.grad is not None  # the loss reads every output the network graph returns
                dst.copy_(o.grad)
            g.bwd.replay()
        if boundary:
            e.update(phases)
        return items
