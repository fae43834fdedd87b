"""The private memory pool of a runner's CUDA graphs, and giving its memory back.

Two of torch's pool rules shape this module:
- a pool whose graphs have all been destroyed may not be captured into again: its use count is 0 but it stays
  registered until its memory is freed, and a capture into it fails torch's `use_count > 0` assert. So a runner
  that drops its graphs (a re-capture for more objects per image, a step-down) takes a new pool.
- a capture that fails at its end (the stream's capture was invalidated, for example by a synchronising call) raises
  out of torch's capture_end before it tells the allocator to stop allocating the capture stream's memory into the
  pool, and its graph never gives its reference to the pool back. Left so, the pool's memory is held for good, and
  the next time the allocator empties a pool's cache it stops the process on its `captures_underway.empty()`
  assert (seen on the H200 with torch 2.11). end_failed_capture() ends that allocation, repair() releases the
  reference, which a torch.cuda.MemPool counts (torch >= 2.6; older torch gets a graph pool handle and no repair).

A pool is dropped, and the allocator's cache emptied, only while no capture is underway in this process (another
thread may be capturing the validation's graph): nn/streams.py's capture lock is held. free_cached() returns the
cached blocks to the driver, so that what nvidia-smi shows after a re-capture or a step-down is what the run uses."""

from __future__ import annotations

import ctypes
import gc
from typing import Any

import torch

from libreyolo.nn import streams


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

    def end_failed_capture(self) -> None:
        """After a capture into this pool raised: make sure the allocator no longer allocates into it for the capture
        stream (torch's error when it already does not is the expected case, a capture that ended its allocation)."""
        end = getattr(torch._C, "_cuda_endAllocateToPool", None)
        if end is None:
            return
        try:
            end(self._index(), self.handle)
        except RuntimeError:
            pass

    def _index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def repair(self, live_graphs: int) -> int:
        """After a failed capture whose graph object is gone: release the references that captures which never
        ended still hold, so that the pool's memory can be freed with the pool. -> how many were released."""
        users = self.users()
        if users is None or users <= live_graphs:
            return 0
        release = getattr(torch._C, "_cuda_releasePool", None)
        if release is None:
            return 0
        for _ in range(users - live_graphs):
            release(self._index(), self.handle)
        return users - live_graphs

    def close(self) -> None:
        """Drop the pool once its graphs are gone: its memory is freed when no tensor from it is alive any more. A
        pool that some graph still holds is never destroyed, not even at the interpreter's exit (an extra reference
        that nothing gives back): destroying a MemPool that a graph uses is an error inside torch, a kept pool
        only memory."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if pool.use_count() > 1:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(pool))
            return
        with streams.no_capture():
            del pool


def free_cached(device: torch.device) -> None:
    """Give the cached, unused blocks back to the driver, after collecting the objects that still held some (the
    autograd graph and static buffers of a failed capture are reachable only through reference cycles)."""
    if device.type != "cuda":
        return
    gc.collect()
    torch.cuda.synchronize(device)
    with streams.no_capture():
        torch.cuda.empty_cache()
