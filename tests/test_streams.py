"""nn/streams.py without a capture: branches run in the order given, on the caller's stream (the GPU side, where a
capture forks them onto side streams and must reproduce eager bitwise, is in tests/test_graphs_gpu.py)."""

import contextlib

import torch

from libreyolo.families.yolo9.network import YOLO9, TrainNet
from libreyolo.nn import streams


def test_branches_outside_a_capture_run_in_order_and_fork_nothing():
    calls: list[int] = []

    def f(k: int):
        def run() -> int:
            calls.append(k)
            return 10 * k

        return run

    before = streams.side_branches()
    assert streams.branches([torch.zeros(2)], f(1), f(2), f(3)) == [10, 20, 30]
    assert calls == [1, 2, 3]
    assert streams.side_branches() == before
    assert not streams.forking(torch.zeros(2))


def test_fork_outside_a_capture_runs_at_once_on_the_callers_stream():
    calls: list[str] = []
    before = streams.side_branches()
    forked = streams.fork([torch.zeros(2)], lambda: calls.append("branch") or 7)
    calls.append("after")
    assert calls == ["branch", "after"]  # the op order an unforked forward has
    assert forked.stream is None and streams.join(forked) == 7
    assert streams.side_branches() == before


def test_train_net_outputs_are_the_detector_and_its_auxiliary_head_on_the_backbone():
    torch.manual_seed(0)
    net = TrainNet(YOLO9("t", nc=3)).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        raw, aux = net(x)
        feats = net.net.backbone(x)
        assert torch.equal(raw, net.net(x))
        assert torch.equal(aux, net.aux(feats)[0])
    assert raw.shape == aux.shape == (1, 4 * 16 + 3, 8 * 8 + 4 * 4 + 2 * 2)


def test_captures_on_two_threads_take_turns(monkeypatch):
    """Every capture shares torch.cuda.graph's capture stream and the side streams: a second thread's capture waits
    for the first's to end (torch.cuda.graph replaced by a stand-in that records when it runs)."""
    import contextlib
    import threading
    import time

    spans: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def fake_graph(graph, **kwargs):
        t0 = time.perf_counter()
        time.sleep(0.05)
        yield
        spans.append((t0, time.perf_counter()))

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)

    def run() -> None:
        with streams.capture(None, capture_error_mode="thread_local"):
            time.sleep(0.05)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, spans


def test_each_capture_takes_the_side_streams_in_the_same_order_whatever_came_before(monkeypatch):
    """Which branches share a side stream decides what the graph's memory pool can reuse (the allocator reuses a
    block only on its own stream): two captures of one network must get the same streams, also after another
    capture (or a failed one) used some."""
    import contextlib

    class FakeStream:
        def __init__(self, device, priority=0):
            self.priority = priority

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(streams, "_streams", {})
    dev = torch.device("cuda", 0)

    def captured(n: int) -> list:
        with streams.capture(None):
            return [streams._side_stream(dev) for _ in range(n)]

    first = captured(14)
    for _ in range(5):  # branches of an earlier capture that stopped part way
        streams._side_stream(dev)
    second = captured(14)
    assert [id(s) for s in first] == [id(s) for s in second]
    assert len({id(s) for s in first[:12]}) == 12 and first[12] is first[0] and first[13] is first[1]
    assert all(s.priority == -1 for s in first)


def test_the_cublas_workspace_of_the_capture_stream_is_made_before_the_capture_and_runners_share_a_warmup_stream(
    monkeypatch,
):
    """cuBLAS keeps a workspace for each (thread's handle, stream) pair it has run on, for the life of the process
    (32 MiB on Hopper). A capture primes its capture stream first, so that the workspace is not allocated in the
    graph's pool (where it kept a failed capture's pool alive: tests/test_capture_gpu.py measures that), and every
    runner's warm-up steps share one stream per device and user instead of taking a new one each."""

    class FakeStream:
        def __init__(self, device=None, priority=0):
            self.device = device

    order: list[tuple[str, object]] = []
    capture_stream = FakeStream()

    class FakeGraph:
        def __init__(self, graph, **kwargs):
            self.capture_stream = capture_stream

        def __enter__(self):
            order.append(("capture", self.capture_stream))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "graph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(streams, "_prime_blas", lambda s: order.append(("prime", s)))
    monkeypatch.setattr(streams, "_warmups", {})
    with streams.capture(None, capture_error_mode="thread_local"):
        pass
    assert order == [("prime", capture_stream), ("capture", capture_stream)]

    dev = torch.device("cuda", 0)
    train = streams.warmup_stream(dev)
    assert streams.warmup_stream(dev) is train and streams.warmup_stream(torch.device("cuda", 0), "train") is train
    val = streams.warmup_stream(dev, "val")
    assert val is not train and streams.warmup_stream(dev, "val") is val
    assert streams.warmup_stream(torch.device("cuda", 1)) is not train

    # a block on the warm-up stream starts after the current stream's queued work, and the current stream waits
    # for the block's work before anything queued after it
    events: list[tuple[str, object, object]] = []
    current = FakeStream(dev)
    current.wait_stream = lambda other: events.append(("wait", current, other))  # type: ignore[attr-defined]
    train.wait_stream = lambda other: events.append(("wait", train, other))  # type: ignore[attr-defined]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext(events.append(("enter", s, None))))
    with streams.on_warmup_stream(dev) as side:
        events.append(("work", side, None))
    assert events == [("wait", train, current), ("enter", train, None), ("work", train, None), ("wait", current, train)]
