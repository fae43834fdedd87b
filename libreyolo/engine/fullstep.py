"""cuda_graph="full": the entire training step in one CUDA graph.

Captured: uint8 -> float normalisation, forward (with the auxiliary head), the loss with its task-aligned
assigner, backward, and at accumulation boundaries unscale / skip-on-inf / clip / optimizer step / loss-
scale update / EMA update (capturable.py). What makes that possible:
- static shapes: targets are padded to a per-image capacity (a multiple of 8) that the setup sets from the label
  scan before the first capture: the most boxes a training batch can hold (data/dataset.py capacity_bound), so a
  run captures once. A batch with more objects than that (only where no bound was given) raises it, and the new
  shape is captured once stable, into a new memory pool (a `recapture`; graphpool.py says why a new one);
- no host synchronisation inside the step: the loss never calls .item() or indexes with a boolean mask,
  the LR and momentum are device tensors refreshed from pinned memory before each replay, and the loss
  terms are read by the trainer's asynchronous meter;
- two graphs per shape: a micro-step (no optimizer) and a boundary step, for gradient accumulation.
Under DDP (NCCL) the boundary step also all-reduces the flat gradient buffer inside the graph, before the
inf check, so every rank unscales, skips or steps alike; the capacity is then fixed for the run, so that every
rank captures and replays the same graphs (NCCL requires a captured collective's graph on all its ranks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from libreyolo import events as ev
from libreyolo.engine.capturable import CapturableUpdate
from libreyolo.engine.graphs import GraphRunner, Shape
from libreyolo.engine.step import EagerStep, Phases, TrainCounters
from libreyolo.nn import streams
from libreyolo.nn.inputs import normalize

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.engine.components import StepParts


class _FullGraph:
    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    # the static input and output buffers, set by capture()
    img: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    items: torch.Tensor


class FullGraphStep(GraphRunner[_FullGraph]):
    mode = "full"

    def __init__(
        self,
        eager: EagerStep,
        parts: StepParts,
        cfg: TrainConfig,
        emit: Callable[[ev.Event], None],
        device: torch.device,
        capacity: int | None = None,
        fixed: bool = False,
        lower: Callable[[], GraphRunner[Any]] | None = None,
    ):
        super().__init__(eager, emit, device, lower)
        self.captures_loss = True
        self.update = CapturableUpdate(
            parts.optimizer, parts.optimizer_name, parts.scaler, parts.ema, cfg.grad_clip, self.flat, device
        )
        self.capacity = capacity or 4
        self.fixed = fixed  # DDP: every rank must capture and replay the same graphs, so none may raise it alone

    # shapes: (B, H, W, 3, capacity); graphs: that plus the boundary flag
    def shape_key(self, img: torch.Tensor, targets: torch.Tensor) -> Shape:
        if targets.shape[1] > self.capacity and self.fixed:
            raise RuntimeError(
                f"a batch has {targets.shape[1]} target slots per image, more than the fixed capacity {self.capacity} "
                "that every DDP rank captured with; please report this with the dataset's largest label counts"
            )
        if targets.shape[1] > self.capacity:
            old, self.capacity = self.capacity, targets.shape[1]
            if self.graphs:
                self.invalidate(
                    f"a batch has more objects per image than the captured capacity {old}: capacity raised to "
                    f"{self.capacity}, recapturing once stable",
                    tuple(img.shape),
                )
        return (*img.shape, self.capacity)

    def graph_key(self, shape: Shape, boundary: bool) -> Shape:
        return (*shape, boundary)

    def describe(self, key: Shape) -> str:
        return f"the whole {'boundary' if key[-1] else 'micro'} step (target capacity {key[4]})"

    def _pad(self, targets: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        extra = self.capacity - targets.shape[1]
        if extra > 0:
            targets = torch.nn.functional.pad(targets, (0, 0, 0, extra))
            mask = torch.nn.functional.pad(mask, (0, extra))
        return targets, mask

    def _body(self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool) -> torch.Tensor:
        e = self.eager
        x = normalize(img, e.channels_last)
        with torch.autocast(
            "cuda", dtype=e.autocast_dtype or torch.float32, enabled=e.autocast_dtype is not None, cache_enabled=False
        ):
            outs = self.flat.forward(x)
        loss, items = e.loss_fn(outs, targets, mask, (img.shape[1], img.shape[2]), e.batch_scale)
        if e.scaler.is_enabled():
            scale = e.scaler._scale
            assert scale is not None  # made by CapturableUpdate before any capture
            loss = loss * scale
        loss.backward()
        self.flat.gather_grads()
        if boundary:
            if e.grad_reduce is not None:  # DDP: one all-reduce of the flat gradients, captured with the rest
                e.grad_reduce(self.flat.flat_grad)
            self.update.step()
        return items

    def run_eager(
        self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases
    ) -> torch.Tensor:
        targets, mask = self._pad(targets, mask)
        if boundary:
            self.update.load_hyper()
        with phases("forward"):
            return self._body(img, targets, mask, boundary)

    def capture(
        self, key: Shape, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool
    ) -> _FullGraph:
        targets, mask = self._pad(targets, mask)
        g = _FullGraph()
        g.img, g.targets, g.mask = img.clone(), targets.clone(), mask.clone()
        pool = self.pools[0] if self.pools else self.new_pool()  # every graph of this capacity shares one pool
        with streams.capture(g.graph, pool=pool.handle, capture_error_mode="thread_local"):
            g.items = self._body(g.img, g.targets, g.mask, boundary)
        return g

    def replay(
        self,
        g: _FullGraph,
        img: torch.Tensor,
        targets: torch.Tensor,
        mask: torch.Tensor,
        boundary: bool,
        phases: Phases,
    ) -> torch.Tensor:
        with phases("to_device"):
            g.img.copy_(img)
            g.targets.zero_()
            g.targets[:, : targets.shape[1]].copy_(targets)
            g.mask.zero_()
            g.mask[:, : mask.shape[1]].copy_(mask)
            if boundary:
                self.update.load_hyper()
        # the replay is the whole step: the profiler sees it as one "forward" phase (docs/cuda-graphs.md)
        with phases("forward"):
            g.graph.replay()
        return g.items

    @property
    def skipped(self) -> torch.Tensor | None:
        return self.lower.skipped if self.lower is not None else self.update.skipped

    @skipped.setter
    def skipped(self, value: torch.Tensor | None) -> None:
        if self.lower is not None:
            self.lower.skipped = value
        else:
            self.update.skipped.zero_()

    def reload(self) -> None:
        super().reload()
        if self.lower is None:
            self.update.reload()

    def train_counters(self) -> TrainCounters:
        return self.lower.train_counters() if self.lower is not None else self.update.train_counters()

    def hand_over(self) -> None:
        """The network graph below updates through torch's optimizer and the EMA's own counter."""
        self.update.hand_back(self.eager)
