"""Kernel warm-up: a process's first training forward and backward, on a copy of the train net, beside the setup.

A CUDA process's first pass costs ~1.1-1.4 s more than its next ones (H200, LibreYOLO9t, batch 16, 640 px,
float16: benchmarks/first_pass.py, docs/performance.md): cuDNN builds an execution plan per convolution shape,
and kernels load on first use. The setup starts a thread that runs one forward, loss and backward of a copy of
the train net, on a batch of the training set's first image repeated, while the main thread builds the optimizer,
EMA, step runner and validation. Loaded kernels serve the whole process, and the backward's plans are cached in
autograd's device thread, which every backward shares. cuDNN caches execution plans per thread, so the run's own
first forward still builds its forward plans. Beside the setup the pass took 1.7-2.1 s on the H200, against
~1.0 s alone: the training loader's pin-memory thread is allocating page-locked memory for its first ~30 batches
meanwhile (1.4 s without pinning; docs/performance.md).

The pass leaves no trace. Its gradients and activations are dropped, and so is the copy (but for the detector
inside it, which the background validation takes over: take_copy). The random generators are restored (a
train-mode forward may draw: dropout, a DETR's denoising noise). A failure is only recorded: the run's own first
step reports real errors. So that restoring the generators loses nothing, the main thread must neither draw from
nor set them between start() and join(). The setup joins before it restores a resumed run's state, and the trainer
joins before the first checkpoint (which records them)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from libreyolo.engine.step import feed_targets, train_forward
from libreyolo.families import LossFn


def warmup_wanted(device: torch.device, world_size: int, cudnn_benchmark: bool) -> bool:
    """One CUDA process without cuDNN's algorithm timing. Elsewhere there is nothing to load (CPU, MPS), or the
    train net's forward is a collective (SyncBatchNorm under DDP) that a second thread must not enter. With the
    timing on (runs of 5,000 steps and more, where the start matters least) the pass would time algorithms while
    the setup's own kernels share the GPU."""
    return device.type == "cuda" and world_size == 1 and not cudnn_benchmark


class KernelWarmup:
    def __init__(
        self,
        make_batch: Callable[[], dict[str, Any]],
        loss_fn: LossFn,
        device: torch.device,
    ):
        """make_batch() -> a collated training batch (img, targets, mask), called on the thread; loss_fn: a loss
        object of the warm-up's own (losses may cache per shape)."""
        self.make_batch, self.loss_fn, self.device = make_batch, loss_fn, device
        self.error: BaseException | None = None
        self.seconds: float | None = None  # the thread's time, once it has ended
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
        """Copies the train net here, on the caller's thread (nothing may change it during the copy), then runs
        the pass on that copy in a thread. net: on its device, in its memory format, before any flat storage.
        keep: a module inside net whose copy take_copy() hands on afterwards (the validation's own copy of the
        detector: one deep copy fewer in the setup)."""
        memo: dict[int, Any] = {}
        replica = copy.deepcopy(net, memo).train()
        self._kept = memo.get(id(keep)) if keep is not None else None
        args = (replica, autocast_dtype, channels_last, batch_scale)
        self._thread = threading.Thread(target=self._run, args=args, name="libreyolo-warmup", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Waits for the pass (if started)."""
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
            f"the first pass's warm-up thread failed ({type(self.error).__name__}: {self.error}); the first step "
            "loads the GPU libraries itself"
        )

    def _run(self, net: nn.Module, autocast_dtype: torch.dtype | None, channels_last: bool, scale: float) -> None:
        t = time.perf_counter()
        cuda = self.device.type == "cuda"
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if cuda else []
        try:
            with torch.random.fork_rng(devices=devices):
                self._pass(net, autocast_dtype, channels_last, scale)
        except Exception as e:  # noqa: BLE001  (recorded: `failure` words it after join())
            self.error = e
        finally:
            self.seconds = time.perf_counter() - t

    def _pass(self, net: nn.Module, autocast_dtype: torch.dtype | None, channels_last: bool, scale: float) -> None:
        batch = self.make_batch()
        img = batch["img"].to(self.device)
        targets, mask = batch["targets"].to(self.device), batch["mask"].to(self.device)
        imgsz = (img.shape[1], img.shape[2])
        feed_targets(net, targets, mask, imgsz)
        outputs = train_forward(net, img, autocast_dtype, channels_last)
        loss, _ = self.loss_fn(outputs, targets, mask, imgsz, scale)
        loss.backward()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the pass's kernels ran before the thread counts as done
