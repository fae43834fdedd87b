"""Loss and throughput meters that never stall the GPU: device-side sums, read back asynchronously."""

from __future__ import annotations

import time
from typing import Any

import torch


class LossMeter:
    """Running sum of the loss terms on the device; `poll()` returns the mean from the last completed copy
    (an empty list until the first copy of the epoch has landed).

    On CUDA the copy to the host is asynchronous: `request()` first harvests the copy that has landed, then
    starts the next, so `poll()` is at most one log interval behind even when the GPU is always busy (a
    GPU-bound `cuda_graph=full` run); it never waits for the GPU."""

    def __init__(self, device: torch.device, n: int):
        self.device = device
        self.sum = torch.zeros(n, device=device)
        self.count = 0
        self.asynchronous = device.type == "cuda"
        self._host = torch.zeros(n, pin_memory=self.asynchronous)
        self._event: torch.cuda.Event | None = None
        self._count_at_copy = 0
        self.mean: list[float] = []

    def reset(self) -> None:
        self.sum.zero_()
        self.count = 0
        self._event = None
        self._count_at_copy = 0
        self.mean = []  # nothing of this epoch has landed yet: report no losses rather than the last epoch's

    def state(self) -> dict[str, Any]:
        """The epoch's sums so far (the tensor itself: a checkpoint snapshot copies it behind the queued steps)."""
        return {"sum": self.sum, "count": self.count}

    def load(self, state: dict[str, Any]) -> None:
        """Continue an epoch from a mid-epoch last.pt's state()."""
        self.sum.copy_(state["sum"])
        self.count = int(state["count"])

    def add(self, items: torch.Tensor) -> None:
        self.sum += items
        self.count += 1

    def _new_event(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record()
        return event

    def _harvest(self) -> None:
        if self._count_at_copy and (self._event is None or self._event.query()):
            self.mean = (self._host / self._count_at_copy).tolist()
            self._count_at_copy = 0  # harvested: the buffer is free for the next copy

    def request(self) -> None:
        """Start a device-to-host copy of the current sum; it lands whenever the GPU gets there."""
        if self.count == 0:
            return
        self._harvest()
        if self._count_at_copy:
            return  # the previous copy is still in flight
        if self.asynchronous:
            self._host.copy_(self.sum, non_blocking=True)
            self._event = self._new_event()
        else:
            self._host.copy_(self.sum)
            self._event = None
        self._count_at_copy = self.count

    def poll(self) -> list[float]:
        self._harvest()
        return self.mean

    def final(self) -> list[float]:
        """Exact mean at the end of an epoch (one synchronisation per epoch)."""
        return (self.sum / max(self.count, 1)).tolist()


class HostRead:
    """A few named device tensors read without waiting for the device: each is copied into page-locked memory behind
    the work already queued on its device's current stream, and get() waits for those copies only, so that the host
    does other work while the GPU finishes the queued steps. On a CPU they are copied at once. A name given None is
    left out."""

    def __init__(self, tensors: dict[str, torch.Tensor | None]):
        self._host: dict[str, torch.Tensor] = {}
        self._event: torch.cuda.Event | None = None
        device = None
        for name, t in tensors.items():
            if t is None:
                continue
            t = t.detach()
            if t.is_cuda:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                device = t.device
            else:
                host = t.clone()
            self._host[name] = host
        if device is not None:
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(device))

    def get(self) -> dict[str, torch.Tensor]:
        """The host copies by name (waits until the device has made them)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host


class Throughput:
    """Images per second and the share of wall time spent waiting for data, over the epoch so far."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.images = 0
        self.data_s = 0.0
        self.steps = 0
        self.t1 = self.t0  # when the first step ended

    def add(self, images: int, data_s: float) -> None:
        self.images += images
        self.data_s += data_s
        self.steps += 1
        if self.steps == 1:
            self.t1 = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return max(time.perf_counter() - self.t0, 1e-9)

    @property
    def img_s(self) -> float:
        return self.images / self.elapsed

    @property
    def data_frac(self) -> float:
        return min(self.data_s / self.elapsed, 1.0)

    @property
    def step_ms(self) -> float:
        return 1000 * self.elapsed / max(self.steps, 1)

    @property
    def steady_step_ms(self) -> float:
        """Per-step time after the epoch's first step (which also pays for loader start, cuDNN autotuning and graph
        capture): what the remaining steps will cost, for the ETA."""
        if self.steps < 2:
            return self.step_ms
        return 1000 * max(time.perf_counter() - self.t1, 1e-9) / (self.steps - 1)
