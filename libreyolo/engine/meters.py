"""Loss and throughput meters that never stall the GPU: device-side sums, read back asynchronously."""

from __future__ import annotations

import time

import torch


class LossMeter:
    """Running sum of the loss terms on the device; `poll()` returns the mean from the last completed copy."""

    def __init__(self, device: torch.device, n: int = 3):
        self.device = device
        self.sum = torch.zeros(n, device=device)
        self.count = 0
        self._host = torch.zeros(n, pin_memory=device.type == "cuda")
        self._event: torch.cuda.Event | None = None
        self._count_at_copy = 0
        self.mean = [float("nan")] * n

    def reset(self) -> None:
        self.sum.zero_()
        self.count = 0
        self._event = None
        self._count_at_copy = 0

    def add(self, items: torch.Tensor) -> None:
        self.sum += items
        self.count += 1

    def request(self) -> None:
        """Start a device-to-host copy of the current sum; it lands whenever the GPU gets there."""
        if self.count == 0:
            return
        if self.device.type == "cuda":
            if self._event is not None and not self._event.query():
                return  # the previous copy is still in flight
            self._host.copy_(self.sum, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host.copy_(self.sum)
        self._count_at_copy = self.count

    def poll(self) -> list[float]:
        if self._count_at_copy and (self._event is None or self._event.query()):
            self.mean = (self._host / self._count_at_copy).tolist()
        return self.mean

    def final(self) -> list[float]:
        """Exact mean at the end of an epoch (one synchronisation per epoch)."""
        return (self.sum / max(self.count, 1)).tolist()


class Throughput:
    """Images per second and the share of wall time spent waiting for data, over the epoch so far."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.images = 0
        self.data_s = 0.0
        self.steps = 0

    def add(self, images: int, data_s: float) -> None:
        self.images += images
        self.data_s += data_s
        self.steps += 1

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
