"""Kernel warm-up: a process's first training forward and backward, on the train net itself, early in the setup.

A CUDA process's first pass costs ~1.1-1.4 s more than its next ones (H200, LibreYOLO9t, batch 16, 640 px,
float16: benchmarks/first_pass.py, docs/performance.md): cuDNN builds an execution plan per convolution shape,
and kernels load on first use; the first call of a detection loss loads its own kernels too. As soon as the train
net is on the GPU and its flat parameters are in place, the setup runs one forward and loss of it, as the step runs
them (through the step's half stand-ins), then that pass's backward in a thread while it builds the optimizer, EMA,
step runner and validation. The batch is the run's first one, read ahead from the loader's first pass
(engine/passes.Peekable), or, where the setup opened no pass, the training set's first image repeated. A new float16
run's start loss scale is read off that first batch here: the backward is then the scale search's passes
(engine/lossscale.py), and the main thread no longer runs them before the first step.
Where the family gives example outputs (Family.example_outputs), the loss's own first call runs on them in another
thread while the network's forward runs, so that its kernels load beside the network's.
Why split so:
- cuDNN caches execution plans per thread: the forward's plans serve only the thread that built them, and the
  run's own forward runs on the setup's thread. The backward's plans are built and cached in autograd's device
  thread, which every backward shares, whichever thread started it.
- The forward and the loss are Python calling one op after another; beside the setup's own Python they would wait
  for the interpreter lock. The backward runs in autograd's engine without it.
Kernels once loaded serve the whole process. On the H200 the run's first forward then took 39-58 ms instead of
210-336 ms after a warm-up run wholly in a thread (docs/performance.md, eighth session).

The pass leaves no trace, and needs no copy of the net (a deep copy took ~0.4 s of the start on the H200,
docs/performance.md, sixteenth session):
- its gradients come from torch.autograd.grad, so nothing accumulates in any .grad, and its activations are dropped;
- the forward runs with the net's buffers swapped for copies (scratch_buffers: a train-mode BatchNorm updates its
  running statistics, and its backward keeps them), the originals back in place as soon as the forward returns;
- the random generators are restored around the forward and loss (a train-mode forward may draw: dropout, a
  DETR's denoising noise); the backward draws nothing.
While the backward runs, the setup only reads the net (the EMA's copy, the optimizer, the validation's copy, the
first last.pt): a resumed run joins it before its state is restored into the net (engine/setup.py), and the trainer
before its first step (a graph capture must not run beside it). A failure is only recorded: the run's own first
step reports real errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from libreyolo.engine.lossscale import ScaleSearch, start_scale
from libreyolo.engine.step import feed_targets, train_forward
from libreyolo.families import ExampleOutputs, LossFn


def warmup_wanted(device: torch.device, world_size: int, cudnn_benchmark: bool) -> bool:
    """One CUDA process without cuDNN's algorithm timing. Elsewhere there is nothing to load (CPU, MPS), or the
    train net's forward is a collective (SyncBatchNorm under DDP) that a second thread must not enter. With the
    timing on (runs of 5,000 steps and more, where the start matters least) the pass would time algorithms while
    the setup's own kernels share the GPU."""
    return device.type == "cuda" and world_size == 1 and not cudnn_benchmark


def loss_beside(
    loss_fn: LossFn,
    example: ExampleOutputs,
    net: nn.Module,
    batch: int,
    imgsz: tuple[int, int],
    dtype: torch.dtype,
    targets: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    device: torch.device,
) -> threading.Thread:
    """Starts the loss's first forward and backward, on the family's example outputs for the train net `net` and the
    batch's own targets, in a thread: a loss's first call loads dozens of kernels (YOLOv9's: 0.45-0.54 s on the
    H200), and two threads' first calls overlap, so they load while the caller's network forward loads its own (the
    process's first forward, loss and backward: 1.07-1.34 s instead of 1.33-1.71 s, docs/performance.md). The
    caller joins it before its real loss; a failure here is left to that loss to report."""

    def run() -> None:
        try:
            outputs = example(net, batch, imgsz, dtype, device, mask)
            loss_fn(outputs, targets, mask, imgsz, scale)[0].backward()
        except Exception:  # noqa: BLE001,S110  (the real loss, next, raises what is wrong)
            pass

    thread = threading.Thread(target=run, name="libreyolo-warmup-loss", daemon=True)
    thread.start()
    return thread


def scratch_buffers(net: nn.Module) -> Callable[[], None]:
    """Swaps every buffer of net's modules for a copy of it (a buffer shared by several modules for one copy) and
    returns the function that puts the originals back. A pass run in between updates the copies (BatchNorm's
    running statistics), and its backward keeps them, not the originals, which nothing then changes."""
    slots: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for m in net.modules():
            for k, b in m._buffers.items():
                if b is not None:
                    if id(b) not in copies:
                        copies[id(b)] = b.clone()
                    slots.append((m._buffers, k, b))
                    m._buffers[k] = copies[id(b)]

    def put_back() -> None:
        for d, k, b in slots:
            d[k] = b

    return put_back


class KernelWarmup:
    def __init__(
        self,
        make_batch: Callable[[], dict[str, Any]],
        loss_fn: LossFn,
        device: torch.device,
        scale_search: ScaleSearch | None = None,
        loss_beside: tuple[LossFn, ExampleOutputs] | None = None,
    ):
        """make_batch() -> a collated training batch (img, targets, mask), called by start(); loss_fn: a loss
        object of the warm-up's own (losses may cache per shape). scale_search: given when make_batch returns the
        run's first batch and the run starts its float16 loss scale from it (engine/lossscale.py): the pass's
        backward is then that search's passes, and `scale` holds what it found. loss_beside: (another loss
        object, the family's example_outputs): the loss's first forward and backward then run on example outputs
        in a thread while the network's first forward runs (loss_beside below)."""
        self.make_batch, self.loss_fn, self.device = make_batch, loss_fn, device
        self.scale_search = scale_search
        self.loss_beside = loss_beside
        self.scale: tuple[float, int | None] | None = None  # (start scale, largest finite exponent), once found
        self.error: BaseException | None = None
        self.seconds: float | None = None  # from start() to the backward's end, once it has ended
        self._thread: threading.Thread | None = None
        self._call: Callable[[torch.Tensor], Any] | None = None  # start()'s forward

    def start(
        self,
        net: nn.Module,
        autocast_dtype: torch.dtype | None,
        channels_last: bool,
        batch_scale: float,
        forward: Callable[[torch.Tensor], Any] | None = None,
        inputs: list[torch.Tensor] | None = None,
    ) -> None:
        """Runs the pass's forward and loss on the train net `net` here, then its backward in a thread. net: on its
        device, in its memory format. forward(x): the step's call of the net (FlatParams.forward, on the half
        stand-ins the step trains through); net itself by default. inputs: the leaves the step's gradients are
        taken for (the stand-ins; net's parameters by default)."""
        t = time.perf_counter()
        cuda = self.device.type == "cuda"
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if cuda else []
        self._call = net if forward is None else forward
        if inputs is None:
            inputs = [p for p in net.parameters() if p.requires_grad]
        hooks = self.scale_search.watch(net) if self.scale_search is not None else []
        put_back = scratch_buffers(net)
        try:
            with torch.random.fork_rng(devices=devices):
                loss = self._forward(net, autocast_dtype, channels_last, batch_scale)
        except Exception as e:  # noqa: BLE001  (recorded: `failure` words it after join())
            self.error, self.seconds = e, time.perf_counter() - t
            return
        finally:
            put_back()
            for h in hooks:
                h.remove()
        self._thread = threading.Thread(
            target=self._backward, args=(loss, inputs, t), name="libreyolo-warmup", daemon=True
        )
        self._thread.start()

    def join(self) -> None:
        """Waits for the backward (if started)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def failure(self) -> str | None:
        """After join(): a line saying what failed, if the pass did."""
        if self.error is None:
            return None
        return (
            f"the first pass's warm-up failed ({type(self.error).__name__}: {self.error}); the first step "
            "loads the GPU libraries itself"
        )

    def _forward(
        self, net: nn.Module, autocast_dtype: torch.dtype | None, channels_last: bool, scale: float
    ) -> torch.Tensor:
        batch = self.make_batch()
        img = batch["img"].to(self.device)
        targets, mask = batch["targets"].to(self.device), batch["mask"].to(self.device)
        imgsz = (img.shape[1], img.shape[2])
        feed_targets(net, targets, mask, imgsz)
        beside = None
        if self.loss_beside is not None:
            dtype = autocast_dtype or torch.float32
            beside = loss_beside(*self.loss_beside, net, img.shape[0], imgsz, dtype, targets, mask, scale, self.device)
        try:
            outputs = train_forward(net if self._call is None else self._call, img, autocast_dtype, channels_last)
        finally:
            if beside is not None:
                beside.join()
        loss, _ = self.loss_fn(outputs, targets, mask, imgsz, scale)
        return loss

    def _backward(self, loss: torch.Tensor, inputs: list[torch.Tensor], t: float) -> None:
        try:
            if self.scale_search is not None:  # the gradients of the run's first step: same weights, same batch
                exp = self.scale_search.search(loss, inputs)
                self.scale = (start_scale(exp), exp)
            else:  # not .backward(): nothing may accumulate in the stand-ins' .grad, which the step gathers
                torch.autograd.grad(loss, inputs, allow_unused=True)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the pass's kernels ran before the thread counts as done
        except Exception as e:  # noqa: BLE001  (recorded: `failure` words it after join())
            self.error = e
        finally:
            self.seconds = time.perf_counter() - t
