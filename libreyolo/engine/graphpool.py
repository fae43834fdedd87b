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
thread may be capturing the validation's graph): nn/streams.py's capture lock is held. empty_cache() returns the
cached blocks to the driver, so that what nvidia-smi shows after a re-capture or a step-down is what the run uses."""

from __future__ import annotations

import ctypes
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

    def repair(self) -> None:
        """Once the pool's graphs are gone: release the references that captures which never ended still hold (a
        MemPool's own is the one left), so that the pool's memory can be freed with it."""
        release = getattr(torch._C, "_cuda_releasePool", None)
        if self._pool is None or release is None:
            return
        for _ in range(self._pool.use_count() - 1):
            release(self._index(), self.handle)

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


def empty_cache(device: torch.device) -> None:
    """Give the allocator's cached, unused blocks back to the driver, once the device's queued work is done."""
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    with streams.no_capture():
        torch.cuda.empty_cache()
