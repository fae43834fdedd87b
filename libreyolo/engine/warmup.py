"""Kernel warm-up: a process's first training forward and backward, on a copy of the train net, early in the setup.

A CUDA process's first pass costs ~1.1-1.4 s more than its next ones (H200, LibreYOLO9t, batch 16, 640 px,
float16: docs/performance-archive.md, 2026-12-02): cuDNN builds an execution plan per convolution shape,
and kernels load on first use; the first call of a detection loss loads its own kernels too. As soon as the train
net is on the GPU, the setup runs one forward and loss of a copy of it on its own thread, then that pass's backward
in a thread while it builds the optimizer, EMA, step runner and validation. The batch is the run's first one, read
ahead from the loader's first pass (engine/passes.Peekable), or, where the setup opened no pass, the training set's
first image repeated. A new float16 run's start loss scale is read off that first batch here: the backward is then
the scale search's passes (engine/lossscale.py), and the main thread no longer runs them before the first step.
Where the family gives example outputs (Family.example_outputs), the loss's own first call runs on them in another
thread while the network's forward runs, so that its kernels load beside the network's.
Why split so:
- cuDNN caches execution plans per thread: the forward's plans serve only the thread that built them, and the
  run's own forward runs on the setup's thread. The backward's plans are built and cached in autograd's device
  thread, which every backward shares, whichever thread started it.
- The forward and the loss are Python calling one op after another; beside the setup's own Python (the deep
  copies) they would wait for the interpreter lock. The backward runs in autograd's engine without it.
Kernels once loaded serve the whole process. On the H200 the run's first forward then took 39-58 ms instead of
210-336 ms after a warm-up run wholly in a thread (docs/performance-archive.md, eighth session).

The pass leaves no trace. Its gradients and activations are dropped, and so is the copy (but for the detector
inside it, which the background validation takes over: take_copy). The random generators are restored around the
forward and loss (a train-mode forward may draw: dropout, a DETR's denoising noise); the backward draws nothing. A
failure is only recorded: the run's own first step reports real errors. A resumed run's state is restored while
the backward runs (nothing restored is the copy's); the validation joins the thread before it takes the copy, and
the trainer before its first step (a graph capture must not run beside it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from libreyolo.engine.lossscale import ScaleSearch, start_scale
from libreyolo.engine.step import feed_targets, train_forward
from libreyolo.families.base import ExampleOutputs, LossFn
from libreyolo.nn.clone import clone


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
        self._kept: nn.Module | None = None

    def start(
        self,
        net: nn.Module,
        autocast_dtype: torch.dtype | None,
        channels_last: bool,
        batch_scale: float,
        keep: nn.Module | None = None,
    ) -> None:
        """Copies the train net and runs the pass's forward and loss on that copy here, then its backward in a
        thread. net: on its device, in its memory format, before any flat storage. keep: a module inside net whose
        copy take_copy() hands on afterwards (the validation's own copy of the detector: one deep copy fewer in the
        setup)."""
        t = time.perf_counter()
        memo: dict[int, Any] = {}
        replica = clone(net, memo).train()
        self._kept = memo.get(id(keep)) if keep is not None else None
        cuda = self.device.type == "cuda"
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if cuda else []
        hooks = self.scale_search.watch(replica) if self.scale_search is not None else []
        try:
            with torch.random.fork_rng(devices=devices):
                loss = self._forward(replica, autocast_dtype, channels_last, batch_scale)
        except Exception as e:  # noqa: BLE001  (recorded: `failure` words it after join())
            self.error, self.seconds = e, time.perf_counter() - t
            return
        finally:
            for h in hooks:
                h.remove()
        inputs = [p for p in replica.parameters() if p.requires_grad]
        self._thread = threading.Thread(
            target=self._backward, args=(loss, inputs, t), name="libreyolo-warmup", daemon=True
        )
        self._thread.start()

    def join(self) -> None:
        """Waits for the backward (if started)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def take_copy(self) -> nn.Module | None:
        """After the pass: the copy of start()'s `keep`, in eval mode, without gradients (once). Its weights are
        the start's and its BatchNorm statistics the pass's own: whoever takes it loads the weights it needs."""
        self.join()
        kept, self._kept = self._kept, None
        if kept is not None:
            for p in kept.parameters():
                p.grad = None
            kept.eval().requires_grad_(False)
        return kept

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
            outputs = train_forward(net, img, autocast_dtype, channels_last)
        finally:
            if beside is not None:
                beside.join()
        loss, _ = self.loss_fn(outputs, targets, mask, imgsz, scale)
        return loss

    def _backward(self, loss: torch.Tensor, inputs: list[torch.Tensor], t: float) -> None:
        try:
            if self.scale_search is not None:
                # the copy's gradients are the train net's at its first step: the same weights (float32 here,
                # cast under autocast, where the step has float16 stand-ins of equal values) and the same batch
                exp = self.scale_search.search(loss, inputs)
                self.scale = (start_scale(exp), exp)
            else:
                loss.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the pass's kernels ran before the thread counts as done
        except Exception as e:  # noqa: BLE001  (recorded: `failure` words it after join())
            self.error = e
        finally:
            self.seconds = time.perf_counter() - t
