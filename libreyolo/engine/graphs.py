"""What the CUDA-graph step runners share: `cuda_graph=True` (netgraph.py) replays the network's forward and
backward from graphs; `cuda_graph="full"` (fullstep.py) replays the whole step. Both are always safe to ask for: a
capture or replay that fails steps down one level (whole step -> network graph -> eager) in one line (a `graph`
event), after the failed level's graphs and memory are given back (graphpool.py), and the run goes on.

A graph is only valid for the exact shapes it captured, so shapes are counted: a shape seen 3 times in a
row is captured (the first two run eagerly on a side stream and double as the warm-up capture needs);
any other shape (the short last batch, multi-scale) runs eagerly."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from libreyolo import events as ev
from libreyolo.engine.flat import FlatParams
from libreyolo.engine.graphpool import GraphPool, empty_cache
from libreyolo.engine.step import NO_PHASES, EagerStep, Phases, TrainCounters
from libreyolo.nn import streams

Shape = tuple[int, ...]  # an input's shape (and a full step's target capacity; a graph's key adds its boundary flag)
STABLE_AFTER = 3  # capture on the 3rd consecutive sighting of a shape
MAX_GRAPHS = 4  # shapes (and micro/boundary variants) kept captured at once
G = TypeVar("G")  # what a runner's capture makes and its replay runs


def vram_mb(device: torch.device) -> tuple[float, float]:
    return torch.cuda.memory_allocated(device) / 2**20, torch.cuda.memory_reserved(device) / 2**20


class GraphRunner(Generic[G]):
    """Shape bookkeeping, capture-or-eager decisions, step-down and events shared by both graph modes.

    lower: makes the runner one level down (the whole step's: the network graph), which takes over after a failed
    capture or replay; without one the failed runner trains eager. Once stepped down, every call goes to `lower`."""

    mode = "off"

    def __init__(
        self,
        eager: EagerStep,
        emit: Callable[[ev.Event], None],
        device: torch.device,
        lower: Callable[[], GraphRunner[Any]] | None = None,
    ):
        self.eager, self.emit, self.device = eager, emit, device
        self.graphs: dict[Shape, G] = {}
        self.pools: list[GraphPool] = []  # the memory pools of the graphs captured since the last release()
        self.last_shape: Shape | None = None
        self.repeats = 0
        self.disabled = False
        self.eager_shapes: set[Shape] = set()
        self._captures = 0
        self.captures_loss = False
        self.make_lower = lower
        self.lower: GraphRunner[Any] | None = None  # the runner one level down, once this one has stepped down
        self._why_next: str | None = None  # why the graphs were dropped: the next capture event says it

    @property
    def captures(self) -> int:
        """Graphs captured so far, the lower level's included (the profiler's window moves past capturing steps)."""
        return self._captures + (self.lower.captures if self.lower is not None else 0)

    @captures.setter
    def captures(self, value: int) -> None:
        self._captures = value - (self.lower.captures if self.lower is not None else 0)

    def new_pool(self) -> GraphPool:
        """A memory pool for a capture, kept (and given back by release()) with this runner's graphs."""
        pool = GraphPool(self.device)
        self.pools.append(pool)
        return pool

    @property
    def flat(self) -> FlatParams:
        """The flat parameters every capture runs against (graph runners are only made where they exist: no DDP)."""
        if self.eager.flat is None:
            raise RuntimeError("CUDA-graph runners need the flat parameter storage, which DDP runs do not have")
        return self.eager.flat

    # subclass interface
    def shape_key(self, img: torch.Tensor, targets: torch.Tensor) -> Shape:
        return tuple(img.shape)

    def run_eager(
        self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases
    ) -> torch.Tensor:
        return self.eager(img, targets, mask, boundary, phases)

    def capture(self, key: Shape, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool) -> G:
        raise NotImplementedError

    def replay(
        self, graph: G, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases
    ) -> torch.Tensor:
        raise NotImplementedError

    def graph_key(self, shape: Shape, boundary: bool) -> Shape:
        return shape

    # the step
    def __call__(
        self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases = NO_PHASES
    ) -> torch.Tensor:
        if self.lower is not None:
            return self.lower(img, targets, mask, boundary, phases)
        if self.disabled:
            return self.run_eager(img, targets, mask, boundary, phases)
        shape = self.shape_key(img, targets)
        self.repeats = self.repeats + 1 if shape == self.last_shape else 1
        self.last_shape = shape
        key = self.graph_key(shape, boundary)
        graph = self.graphs.get(key)
        if graph is None and self.repeats >= STABLE_AFTER:
            graph = self._try_capture(key, img, targets, mask, boundary)
            if self.lower is not None:  # the capture failed and the run stepped down: this step runs there
                return self.lower(img, targets, mask, boundary, phases)
        if graph is None:
            if self.graphs and shape not in self.eager_shapes and all(k[: len(shape)] != shape for k in self.graphs):
                self.eager_shapes.add(shape)
                self.emit(
                    ev.Graph(
                        action="eager_shape",
                        mode=self.mode,
                        reason=f"shape {list(shape)} differs from the captured one(s): it runs eager",
                        shape=list(shape),
                    )
                )
            return self._eager_side(img, targets, mask, boundary, phases)
        try:
            return self.replay(graph, img, targets, mask, boundary, phases)
        except Exception as e:  # a failed replay must never end the run
            failed = f"replay failed ({type(e).__name__}: {e})"
        del graph  # what the failed replay held goes with the graphs (after the except: its traceback is gone)
        self._fallback(failed, shape)
        if self.lower is not None:
            return self.lower(img, targets, mask, boundary, phases)
        return self.run_eager(img, targets, mask, boundary, phases)

    def _eager_side(
        self, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool, phases: Phases
    ) -> torch.Tensor:
        """Uncaptured steps run on a side stream: the steps before a capture are its warm-up iterations,
        which CUDA graphs require to happen off the capturing stream (and they are real training steps,
        so BatchNorm statistics see exactly what eager training would)."""
        if self.device.type != "cuda":  # only tests drive a runner without a GPU
            return self.run_eager(img, targets, mask, boundary, phases)
        with streams.on_warmup_stream(self.device):
            return self.run_eager(img, targets, mask, boundary, phases)

    def _try_capture(
        self, key: Shape, img: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, boundary: bool
    ) -> G | None:
        if len(self.graphs) >= MAX_GRAPHS:
            return None
        cuda = self.device.type == "cuda"
        if cuda:
            # torch.cuda.graph() empties the allocator cache on entry: do it first, so that before/after
            # differ only by what the capture itself keeps
            empty_cache(self.device)
        before = vram_mb(self.device) if cuda else (0.0, 0.0)
        try:
            graph = self.capture(key, img, targets, mask, boundary)
            if cuda:
                torch.cuda.synchronize(self.device)
        except Exception as e:
            failed: str | None = f"capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        else:
            failed = None
        if failed is not None:  # outside the except clause: the failed capture's frames are unreachable by now
            for pool in self.pools:
                pool.end_failed_capture()
            self._fallback(failed, key)
            return None
        after = vram_mb(self.device) if cuda else (0.0, 0.0)
        self.graphs[key] = graph
        self._captures += 1
        why = f"re-captured: {self._why_next}; " if self._why_next else ""
        self.emit(
            ev.Graph(
                action="capture" if self._captures == 1 else "recapture",
                mode=self.mode,
                reason=f"{why}captured {self.describe(key)} after {STABLE_AFTER} steps of shape {list(key[:4])}",
                shape=list(key[:4]),
                allocated_before_mb=before[0],
                allocated_after_mb=after[0],
                reserved_before_mb=before[1],
                reserved_after_mb=after[1],
                delta_allocated_mb=after[0] - before[0],
                delta_reserved_mb=after[1] - before[1],
            )
        )
        return graph

    def describe(self, key: Shape) -> str:
        return "the network's forward and backward"

    def _fallback(self, reason: str, shape: Shape | None) -> None:
        """A capture or replay failed: give back what this level holds, then step down one level (or train eager),
        saying so in one event."""
        self.disabled = True
        self.release()
        where = list(shape[:4]) if shape else None
        lower = self.make_lower() if self.make_lower is not None else None
        if lower is None:
            reason += "; training eager from here on"
            self.emit(ev.Graph(action="fallback", mode=self.mode, reason=reason, shape=where))
            return
        self.hand_over()
        self.lower = lower
        self.emit(
            ev.Graph(
                action="step_down",
                mode=lower.mode,
                reason=f"{reason}; {lower.describe(())} in a graph from here on ({NAMES[lower.mode]})",
                shape=where,
            )
        )

    def hand_over(self) -> None:
        """Before the level below takes over: put state this level keeps its own way back where that level reads it
        (the whole step keeps the EMA's and AdamW's counters on the device)."""

    def release(self) -> None:
        """Drop every graph and give their memory back: the graphs first (each gives its reference to its pool
        back), then references that captures which never ended still hold, the pools, and the cached blocks."""
        self.graphs.clear()
        self.last_shape, self.repeats = None, 0
        if self.device.type != "cuda":
            self.pools.clear()
            return
        # the dropped graphs, and a failed capture's autograd graph and static buffers, which only reference cycles
        # still reach, go first: each graph gives its reference to its pool back as it goes
        gc.collect()
        pools, self.pools = self.pools, []
        for pool in pools:
            pool.repair()
            pool.close()
        empty_cache(self.device)

    def close(self) -> None:
        """The run is over: give back every graph and pool of this runner and the level below."""
        if self.lower is not None:
            self.lower.close()
        self.release()

    def invalidate(self, reason: str, shape: Shape | None = None) -> None:
        """Drop every graph (a family hook calls this when what a captured step computes changes; the full-step
        runner when the target capacity grows) and their pools; shapes are counted again and captured anew, into
        a new pool, once stable, and that capture's event repeats the reason."""
        if self.lower is not None:
            self.lower.invalidate(reason)
            return
        if not self.graphs and not self._captures:
            return  # nothing captured yet: the first capture will hold the change
        self.release()
        self._why_next = reason
        self.emit(ev.Graph(action="invalidate", mode=self.mode, reason=reason, shape=list(shape) if shape else None))

    # passthroughs the trainer uses (to the level below once stepped down)
    @property
    def skipped(self) -> torch.Tensor | None:
        return self.lower.skipped if self.lower is not None else self.eager.skipped

    @skipped.setter
    def skipped(self, value: torch.Tensor | None) -> None:
        if self.lower is not None:
            self.lower.skipped = value
        else:
            self.eager.skipped = value

    def sync(self) -> None:
        """Before a checkpoint: nothing runs beside the step here."""

    def train_counters(self) -> TrainCounters:
        return self.lower.train_counters() if self.lower is not None else self.eager.train_counters()

    def reload(self) -> None:
        if self.lower is not None:
            self.lower.reload()
        else:
            self.eager.reload()


NAMES = {"network": "cuda_graph=true", "full": "cuda_graph=full"}  # a runner's mode as the key spells it
