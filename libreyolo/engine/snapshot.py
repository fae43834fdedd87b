"""Checkpoint records taken off the device without waiting for it, and the packed form of a train state."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

PACKED = "libreyolo.packed/v1"  # a subtree stored as a few flat buffers and a tree of places in them
_TENSOR = "\x00tensor"  # the key of a packed tensor's place in the tree: [buffer, offset, *shape]
# A packed buffer's size limit: packing takes that much device memory for a moment, at an epoch's end, beside
# what the run holds (a CUDA graph's pool included); larger records are packed in several buffers.
CHUNK_BYTES = 64 * 2**20


_DESCEND = object()  # a leaf function's answer: not a leaf, map into it


def _map(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """obj rebuilt: each value leaf() answers for replaced by its answer, dicts, lists and tuples (of the same type)
    mapped into otherwise, anything else kept."""
    got = leaf(obj)
    if got is not _DESCEND:
        return got
    if isinstance(obj, dict):
        return {k: _map(v, leaf) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, leaf) for v in obj)
    return obj


class _Slot:
    """Where a device tensor sat in a snapshotted record: its packed buffer, offset, and shape."""

    __slots__ = ("buffer", "offset", "shape")

    def __init__(self, buffer: int, offset: int, shape: torch.Size):
        self.buffer, self.offset, self.shape = buffer, offset, shape


class Snapshot:
    """A checkpoint record that training can no longer change, taken without waiting for the GPU.

    A record holds hundreds of tensors (weights, EMA, optimizer state); copying each to the CPU is a synchronous
    transfer apiece, ~0.5 s of the training thread per epoch on the H200 machine (docs/performance.md). Here
    the tensors are packed per (device, dtype) into buffers of at most CHUNK_BYTES, each by a single kernel (on a
    GPU queued behind the training steps already issued), and copied into pinned host memory without blocking;
    an event marks each copy. resolve(), on the writer thread, waits for the events and unpacks separate,
    contiguous CPU tensors: the same record a copy of each tensor gave. Where the device has no room for a
    packed buffer, its tensors are copied one by one, waiting, as before.

    packed=True: resolve() gives the packed form instead, {"packed", "buffers", "tree"}: the train state has
    thousands of tensors (weights, optimizer moments, step counters), which torch.save pickles one by one
    holding the interpreter lock, beside the training thread; as a few flat buffers, LibreYOLO9t's last.pt saves
    in 155 ms instead of 320-600 ms (CPU machine). unpack() restores the plain tree. A Snapshot nested in the
    record resolves in place."""

    def __init__(self, obj: Any, packed: bool = False):
        self.packed = packed
        self._device: list[tuple[torch.Tensor, _Slot]] = []
        self._groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        self._template = _map(obj, self._leaf)
        self._host: list[torch.Tensor] = []
        self._events: list[Any] = []
        for members in self._groups.values():
            chunk: list[int] = []
            size = 0
            for i in members:
                nbytes = self._device[i][0].nbytes
                if chunk and size + nbytes > CHUNK_BYTES:
                    self._pack(chunk)
                    chunk, size = [], 0
                chunk.append(i)
                size += nbytes
            self._pack(chunk)
        self._device = []  # the packed copies are queued: the record's own tensors are no longer needed

    def _pack(self, members: list[int]) -> None:
        """One buffer: these tensors (one device and dtype) packed on their device, then copied to the host."""
        b, offset, parts = len(self._host), 0, []
        for i in members:
            t, slot = self._device[i]
            slot.buffer, slot.offset = b, offset
            offset += t.numel()
            parts.append(t.reshape(-1))
        try:
            with torch.no_grad():  # a state dict's tensors may still require grad: the copy must not
                flat = torch.cat(parts)
        except torch.cuda.OutOfMemoryError:  # no room for the packed copy: each tensor to the host on its own (waits)
            self._host.append(torch.cat([t.detach().cpu() for t in parts]))
            return
        if not flat.is_cuda:  # already a host copy of its own
            self._host.append(flat)
            return
        host = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        self._host.append(host)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(flat.device))
        self._events.append(event)

    def _leaf(self, obj: Any) -> Any:
        """_map's leaf for the walk: a tensor becomes its slot (filled in by _pack); a nested Snapshot stays."""
        if isinstance(obj, torch.Tensor):
            slot = _Slot(0, 0, obj.shape)
            self._groups.setdefault((obj.device, obj.dtype), []).append(len(self._device))
            self._device.append((obj, slot))
            return slot
        if isinstance(obj, Snapshot):
            return obj
        return _DESCEND

    def resolve(self) -> Any:
        """The record with every tensor on the CPU (waits for the device copies), or its packed form."""
        for event in self._events:
            event.synchronize()

        def fill(obj: Any) -> Any:
            if isinstance(obj, _Slot):
                if self.packed:
                    return {_TENSOR: [obj.buffer, obj.offset, *obj.shape]}
                n = math.prod(obj.shape)
                return self._host[obj.buffer][obj.offset : obj.offset + n].view(obj.shape).clone()
            if isinstance(obj, Snapshot):
                return obj.resolve()
            return _DESCEND

        tree = _map(self._template, fill)
        return {"packed": PACKED, "buffers": list(self._host), "tree": tree} if self.packed else tree


class Amended:
    """A snapshotted record with some top-level entries replaced (values or nested Snapshots), resolved on the writer
    thread: one snapshot of an epoch's end serves last.pt (with the train state added) and, once that epoch's
    validation has landed as the best, best.pt (with the new best fitness and metrics), without a second pack."""

    def __init__(self, base: Snapshot, **changes: Any):
        self.base, self.changes = base, changes

    def resolve(self) -> dict[str, Any]:
        out = dict(self.base.resolve())
        out.update({k: v.resolve() if isinstance(v, Snapshot) else v for k, v in self.changes.items()})
        return out


def snapshot(obj: Any, packed: bool = False) -> Snapshot:
    """See Snapshot: what CheckpointWriter.submit takes; resolve() gives the plain (or packed) record."""
    return Snapshot(obj, packed)


def unpack(packed: dict[str, Any]) -> Any:
    """The plain tree of a packed subtree: every tensor a separate copy out of its buffer."""
    buffers = packed["buffers"]

    def fill(obj: Any) -> Any:
        if isinstance(obj, dict) and _TENSOR in obj:
            b, offset, *shape = obj[_TENSOR]
            return buffers[b][offset : offset + math.prod(shape)].view(shape).clone()
        return _DESCEND

    return _map(packed["tree"], fill)
