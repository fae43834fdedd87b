"""Page-locked staging of training batches through a few fixed buffers, instead of the DataLoader's pinning.

torch's pin-memory thread page-locks every batch as soon as a worker delivers it. Its workers queue 2 batches each,
so on a 16-core host ~30 batches (19.7 MB each at batch 16, 640 px, held in 32 MB blocks of torch's host
allocator) are page-locked while the setup builds the run: ~1 GB of cudaHostAlloc, which slowed the setup's CUDA
work and memory mapping meanwhile (H200, docs/performance.md). Here a thread takes the workers' batches as they come,
as torch's pin thread does, but copies each into one of a few page-locked slots, allocated once and reused for the
run; the batches behind them wait in the workers' shared memory.

The thread reads the loader's iterator (receiving a batch from a worker costs a round trip to that process per
tensor: it must not be on the training loop's thread). A slot handed out goes back to the pool when the next batch is
asked for: its host-to-device copies were queued on the caller's stream by then, and an event recorded there tells
the thread when they have run. close() stops the thread before anyone else touches the iterator (the next pass of
persistent workers resets it; releasing the workers shuts it down).

With `to_device` keys the thread also copies those tensors to the GPU, on a stream of its own, as soon as a batch is
staged: the copy (19.7 MB, ~0.5 ms at batch 16, 640 px on an H200) then runs beside the steps queued before it
instead of between two of them on the training stream, where it cost a whole-step graph 0.43 ms a step
(docs/performance-archive.md, thirteenth session). The caller's stream waits for that copy's event when it takes the
batch, and a slot's device buffers are reused under the same event as its page-locked ones.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Slots: the caller's batch and up to SLOTS - 1 staged behind it. A slot is refilled one batch after the caller let it
# go, once the GPU has run its copies.
SLOTS = 4
# close() waits at most this long for the thread: it ends as soon as the batch it is receiving arrives, which only a
# hung worker delays (torch reports a dead one)
CLOSE_TIMEOUT_S = 30.0


def _view(
    buffers: dict[str, torch.Tensor], key: str, like: torch.Tensor, make: Callable[[int], torch.Tensor]
) -> torch.Tensor:
    """A view shaped like `like` at the start of buffers[key], which make(nbytes) replaces when it is too small."""
    nbytes = like.numel() * like.element_size()
    buf = buffers.get(key)
    if buf is None or buf.numel() < nbytes:
        buf = buffers[key] = make(nbytes)
    return buf[:nbytes].view(like.dtype).view(like.shape)


class _Slot:
    """Page-locked buffers, one per batch key, grown when a batch needs more; with an upload stream, device buffers
    for the keys it uploads and the event after that upload; and the event after which the previous batch's reads
    out of them have run."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: dict[str, torch.Tensor] = {}
        self.device_buffers: dict[str, torch.Tensor] = {}
        self.event: torch.cuda.Event | None = None  # recorded on the caller's stream after its use of the batch
        self.uploaded: torch.cuda.Event | None = None  # recorded on the upload stream after this batch's copies

    def fill(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.event is not None:
            self.event.synchronize()  # the copies and steps that read this slot have run on the GPU
            self.event = None
        out = dict(batch)
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                dst = _view(self.buffers, k, v, lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=self.pin))
                dst.copy_(v)
                out[k] = dst
        return out

    def upload(self, batch: dict[str, Any], keys: tuple[str, ...], stream: torch.cuda.Stream) -> dict[str, Any]:
        """Copies batch[keys] (staged, page-locked) into this slot's device buffers on `stream` (allocated there);
        the caller's stream waits for self.uploaded before it reads them."""
        out = dict(batch)
        dev = stream.device

        def make(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.uint8, device=dev)

        with torch.cuda.stream(stream):
            for k in keys:
                v = batch.get(k)
                if isinstance(v, torch.Tensor):
                    dst = _view(self.device_buffers, k, v, make)
                    dst.copy_(v, non_blocking=True)
                    out[k] = dst
            self.uploaded = stream.record_event()
        return out


_END = object()


class PinnedStager(Iterator[dict[str, Any]]):
    """Iterates `source` (a loader pass of dict batches) with every tensor of a batch copied into page-locked
    memory by a thread that runs ahead of the caller, and the tensors named in `to_device` also copied to the
    device there (on a stream of the thread's; the caller's stream waits for them when it takes the batch). A
    batch's tensors stay valid until the next __next__: copy the others to the device (non_blocking, on the current
    stream) before asking for the next one. With no CUDA device (tests, CPU runs) batches are staged in ordinary
    memory, `to_device` is ignored and slots are recycled without events."""

    def __init__(
        self,
        source: Iterator[dict[str, Any]],
        device: torch.device | None,
        slots: int = SLOTS,
        to_device: tuple[str, ...] = (),
    ) -> None:
        if slots < 2:
            raise ValueError(f"slots={slots}: staging needs the caller's slot and one to fill")
        self._device = device if device is not None and device.type == "cuda" else None
        self._free: queue.SimpleQueue[_Slot | None] = queue.SimpleQueue()  # None: stop
        for _ in range(slots):
            self._free.put(_Slot(pin=self._device is not None))
        self._done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._held: _Slot | None = None
        upload = (to_device, torch.cuda.Stream(self._device)) if self._device is not None and to_device else None
        # the thread holds the queues and the source, not the stager: a stager dropped unclosed still ends it
        args = (source, self._free, self._done, self._stop, upload)
        self._thread: threading.Thread | None = threading.Thread(
            target=_stage_loop, args=args, name="libreyolo-stage", daemon=True
        )
        self._thread.start()

    def __next__(self) -> dict[str, Any]:
        stream = torch.cuda.current_stream(self._device) if self._device is not None else None
        if self._held is not None:
            if stream is not None:
                self._held.event = stream.record_event()
            self._free.put(self._held)
            self._held = None
        if self._thread is None:
            raise StopIteration
        item = self._done.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._held, batch = item
        if stream is not None and self._held.uploaded is not None:
            stream.wait_event(self._held.uploaded)
            for buf in self._held.device_buffers.values():
                buf.record_stream(stream)  # freed with the stager: not reused before this stream has read it
        return batch

    def close(self) -> None:
        """Ends the thread: at once if it waits for a slot, after the batch it is receiving otherwise. The source
        is the caller's to release afterwards."""
        if self._thread is None:
            return
        self._stop.set()
        self._free.put(None)
        self._thread.join(CLOSE_TIMEOUT_S)
        self._thread = None

    def __del__(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._free.put(None)


def _stage_loop(
    source: Iterator[dict[str, Any]],
    free: queue.SimpleQueue[_Slot | None],
    done: queue.SimpleQueue[Any],
    stop: threading.Event,
    upload: tuple[tuple[str, ...], torch.cuda.Stream] | None,
) -> None:
    while (slot := free.get()) is not None and not stop.is_set():
        try:
            raw = next(source)
        except StopIteration:
            done.put(_END)
            return
        except Exception as e:  # noqa: BLE001  (a worker's error: the caller's thread raises it, in order)
            done.put(e)
            return
        if stop.is_set():
            return
        try:
            batch = slot.fill(raw)
            if upload is not None:
                batch = slot.upload(batch, *upload)
            done.put((slot, batch))
        except Exception as e:  # noqa: BLE001
            done.put(e)
            return
