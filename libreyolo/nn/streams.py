"""Independent branches of a network on CUDA streams of their own while a CUDA graph is being captured.

A captured training step of a small detector is a chain of ~2,700 small kernels; between two dependent kernels the
GPU idles for the launch latency, and a small layer fills few of the GPU's multiprocessors. Where a network has
branches that do not depend on each other (the 1x1 and 3x3 halves of a RepConvN, a detection head's levels and its
box and class branches, the auxiliary head beside the neck), capturing each on its own stream makes them parallel
paths of the graph, which the GPU runs side by side.

Only captures fork: an eager step is host-bound (the GPU waits for the host anyway), and each fork would add host
work there. The arithmetic is the same either way (every op gets the same inputs), and so is the backward's order of
gradient accumulation, which autograd decides on the host: each backward op runs on its forward op's stream, and
autograd joins the streams before backward() returns."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")

# LIBREYOLO_BRANCH_STREAMS=0 captures every branch on the capturing stream (benchmarks compare the two)
ENABLED = os.environ.get("LIBREYOLO_BRANCH_STREAMS", "1") != "0"
_POOL = 12  # side streams per device; branches beyond it share one (still correct, less parallel)
_streams: dict[int, list[torch.cuda.Stream]] = {}
_next = [0]  # side branches started so far (side_branches())
# the side stream the next branch takes, counted from the start of the capture underway. The caching allocator
# reuses a freed block only for an allocation on the block's own stream, so which branches share a stream decides
# how much memory the graph's pool needs: counted from each capture's start, a capture of one network gets the same
# streams, and so the same pool, whatever was captured (or failed to capture) before it in the process
_turn = [0]


# one capture at a time in a process: every capture shares torch.cuda.graph's capture stream and these side streams,
# and the validation's graph may be captured on its own thread while a training step is being re-captured
_CAPTURES = threading.Lock()
_warmups: dict[tuple[int, str], torch.cuda.Stream] = {}


def no_capture() -> threading.Lock:
    """Held: no capture of this process is underway (for what torch refuses during one: emptying the allocator's
    cache, dropping a memory pool)."""
    return _CAPTURES


@contextlib.contextmanager
def capture(graph: torch.cuda.CUDAGraph, **kwargs: Any) -> Iterator[None]:
    """torch.cuda.graph(graph, **kwargs), once no other thread of this process is capturing. A capture that fails
    at its end leaves torch's capture stream current (torch.cuda.graph's exit skips restoring it when capture_end
    raises): the stream the caller had is made current again."""
    with _CAPTURES:
        before = torch.cuda.current_stream() if torch.cuda.is_initialized() else None
        _turn[0] = 0
        ctx = torch.cuda.graph(graph, **kwargs)
        stream = getattr(ctx, "capture_stream", None)  # torch.cuda.graph's attribute, not documented API
        if stream is not None:
            _prime_blas(stream)
        try:
            with ctx:
                yield
        except BaseException:
            if before is not None:
                torch.cuda.set_stream(before)
            raise


def _prime_blas(stream: torch.cuda.Stream) -> None:
    """One small matrix product (float32, and float16 with a bias: cuBLAS and cuBLASLt) on the capture stream,
    outside the capture. cuBLAS keeps a workspace (32 MiB on Hopper) for each (thread's handle, stream) pair it
    has run on, made at the pair's first product and kept for the life of the process. Made inside a capture it
    would be allocated in that graph's pool, and keep that pool's memory after its graphs are dropped (a
    re-capture, a step-down); made here it lives in the general pool, and every capture of this thread shares it."""
    with torch.cuda.stream(stream):
        a = torch.ones(8, 8, device=stream.device)
        torch.mm(a, a)
        h = a.half()
        torch.nn.functional.linear(h, h, h[0])


def warmup_stream(device: torch.device, user: str = "train") -> torch.cuda.Stream:
    """The stream a thread's uncaptured steps and capture warm-ups run on (CUDA graphs want them off the capturing
    stream): one per device and user for the whole process ("train": the step runners; "val": the validation's
    graph, whose thread runs beside training and must not queue work behind it). A stream of its own for each
    runner or capture would leave one more cuBLAS workspace (_prime_blas) each time."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _warmups.get((index, user))
    if stream is None:
        stream = _warmups[(index, user)] = torch.cuda.Stream(torch.device("cuda", index))
    return stream


@contextlib.contextmanager
def on_warmup_stream(device: torch.device, user: str = "train") -> Iterator[torch.cuda.Stream]:
    """Run the block on warmup_stream(device, user), ordered after what the current stream has queued, and make the
    current stream wait for the block's work before going on."""
    side = warmup_stream(device, user)
    current = torch.cuda.current_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield side
    current.wait_stream(side)


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _streams.setdefault(index, [])
    _next[0] += 1
    turn = _turn[0] % _POOL
    _turn[0] += 1
    if turn == len(pool):
        # from torch's pool of high-priority streams, which nothing else here takes from (the loader's upload and
        # the background validation take default-priority streams, which run outside the capture: sharing one
        # would pull their work into the graph). The pool is made before any capture (torch.cuda.graph takes
        # its capture stream from it), so no CUDA call is made here while capturing. torch instantiates graphs
        # to honour the priority each kernel was captured with, so side branches run ahead of the capturing
        # stream's kernels, and of the validation's, when both are ready (measured with this: docs/performance.md)
        pool.append(torch.cuda.Stream(device, priority=-1))
    return pool[turn]


def _record(value: Any, stream: torch.cuda.Stream) -> None:
    """Tell the caching allocator that stream uses value's tensors: their memory is not handed to another
    allocation until that stream's work on them is done."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _record(v, stream)


def side_branches() -> int:
    """How many branches have run on a side stream in this process so far."""
    return _next[0]


def forking(x: torch.Tensor) -> bool:
    """Whether branches() would put side branches on streams of their own for a network input x."""
    return ENABLED and x.is_cuda and torch.cuda.is_current_stream_capturing()


class Forked(Generic[T]):
    """A branch started by fork(): its value, and the side stream it runs on (None: it ran on the caller's)."""

    def __init__(self, value: T, stream: torch.cuda.Stream | None):
        self.value, self.stream = value, stream


def fork(inputs: Sequence[torch.Tensor], fn: Callable[[], T], after: torch.cuda.Event | None = None) -> Forked[T]:
    """Start fn() now; join() gives its value. While a CUDA graph is captured it runs on a side stream that waits
    for what the current stream has queued so far (or for the event `after`), so the caller's next ops (recorded
    after it, in the same order as without streams) run beside it until join()."""
    if not inputs or not forking(inputs[0]):
        return Forked(fn(), None)
    side = _side_stream(inputs[0].device)
    side.wait_event(after if after is not None else torch.cuda.current_stream(inputs[0].device).record_event())
    _record(list(inputs), side)
    with torch.cuda.stream(side):
        return Forked(fn(), side)


def join(forked: Forked[T]) -> T:
    """fork()'s value; the current stream first waits for the side stream it ran on."""
    if forked.stream is not None:
        main = torch.cuda.current_stream(forked.stream.device)
        main.wait_stream(forked.stream)
        _record(forked.value, main)
    return forked.value


def branches(inputs: Sequence[torch.Tensor], *fns: Callable[[], T]) -> list[T]:
    """[f() for f in fns]. While a CUDA graph is captured, fns[1:] each run on a side stream that first waits for
    what the current one had queued before fns[0], and the current stream waits for all of them before this
    returns. inputs: the tensors the branches read (made on the current stream), kept from reuse until the side
    streams are done with them."""
    if not inputs or not forking(inputs[0]):
        return [f() for f in fns]
    # what the side branches wait for: the inputs, not fns[0]'s work
    ready = torch.cuda.current_stream(inputs[0].device).record_event()
    # run in the order given, as without streams: the ops (and so the backward's order of gradient accumulation,
    # which follows the order the forward recorded them in) are exactly those of an unforked forward
    first = fns[0]()
    sides = [fork(inputs, f, after=ready) for f in fns[1:]]
    return [first, *(join(side) for side in sides)]
