"""The private memory pool of a runner's CUDA graphs, and giving its memory back.

Two of torch's pool rules shape this module:
- a pool whose graphs have all been destroyed may not be captured into again: its use count is 0 but it stays
  registered until its memory is freed, and a capture into it fails torch's `use_count > 0` assert. So a runner
  that drops its graphs (a re-capture for more objects per image, a step-down) takes a new pool.
- a graph gives its reference to the pool back only once it holds a captured graph; a capture that fails at its
  end (the stream's capture was invalidated, for example by a synchronising call) keeps the reference for good,
  and with it every byte the capture allocated. A torch.cuda.MemPool counts its users, so the reference the failed
  capture kept can be found and released (torch >= 2.6; older torch gets a graph pool handle and no repair).

free_cached() then returns the cached blocks to the driver, so that what nvidia-smi shows after a re-capture or
a step-down is what the run uses."""

from __future__ import annotations

import gc
from typing import Any

import torch


class GraphPool:
    """A pool that graphs share (pass `handle` as torch.cuda.graph's pool), held until close()."""

    def __init__(self, device: torch.device):
        self.device = device
        mem_pool = getattr(torch.cuda, "MemPool", None)
        self._pool: Any = mem_pool() if mem_pool is not None else None
        self.handle: tuple[int, int] = self._pool.id if self._pool is not None else torch.cuda.graph_pool_handle()

    def users(self) -> int | None:
        """Graphs holding the pool (None where torch cannot say)."""
        return self._pool.use_count() - 1 if self._pool is not None else None  # 1: the MemPool's own reference

    def repair(self, live_graphs: int) -> int:
        """After a failed capture whose graph object is gone: release the references that captures which never
        ended still hold, so that the pool's memory can be freed with the pool. -> how many were released."""
        users = self.users()
        if users is None or users <= live_graphs:
            return 0
        release = getattr(torch._C, "_cuda_releasePool", None)
        if release is None:
            return 0
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        for _ in range(users - live_graphs):
            release(index, self.handle)
        return users - live_graphs

    def close(self) -> None:
        """Drop the pool once its graphs are gone: its memory is freed when no tensor from it is alive any more. A
        pool that some graph still holds is kept for the process's life instead: destroying a MemPool that a graph
        uses is an error inside torch, a kept pool only memory."""
        pool, self._pool = self._pool, None
        if pool is not None and pool.use_count() > 1:
            _HELD.append(pool)


_HELD: list[Any] = []  # pools close() could not drop (see there)


def free_cached(device: torch.device) -> None:
    """Give the cached, unused blocks back to the driver, after collecting the objects that still held some (the
    autograd graph and static buffers of a failed capture are reachable only through reference cycles)."""
    if device.type != "cuda":
        return
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
