"""The eager step's backward beside the next forward (engine/overlap.py): the same training, errors not lost."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import step_batches

from libreyolo.config import TrainConfig
from libreyolo.engine.components import overlap_wanted
from libreyolo.engine.overlap import PendingBackward

CPU = torch.device("cpu")


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU reductions split by thread count: one thread keeps them bitwise comparable
    yield
    torch.set_num_threads(n)


def _run(overlap, cfg, batches, nc, record=None):
    from libreyolo.bench.step import make_runner

    step, parts = make_runner(cfg, CPU, nc, "eager")
    step.overlap_backward = overlap
    if record is not None:
        inner = step._backward

        def backward(loss):
            record.append(threading.current_thread().name)
            inner(loss)

        step._backward = backward
    losses = []
    for i, b in enumerate(batches):
        losses.append(step(b["img"], b["targets"], b["mask"], (i + 1) % parts.accumulate == 0))
    step.sync()
    return torch.stack(losses), parts


def test_overlapped_backward_trains_bit_for_bit_like_the_plain_step(one_thread):
    cfg = TrainConfig.from_overrides({"model": "LibreYOLO9t", "imgsz": 64, "batch": 2, "nbs": 8, "device": "cpu"})
    batches, nc = step_batches(cfg, 8, CPU)  # two accumulation windows of 4
    threads: list[str] = []
    want, ref = _run(False, cfg, batches, nc)
    got, parts = _run(True, cfg, batches, nc, threads)
    # three micro-steps per window ran their backward on the helper; the boundary step on the loop's thread
    assert threads == (["libreyolo-backward"] * 3 + [threading.current_thread().name]) * 2
    assert torch.equal(got, want)
    for (name, a), b in zip(parts.train_net.state_dict().items(), ref.train_net.state_dict().values()):
        assert torch.equal(a, b), name
    assert parts.flat is not None and ref.flat is not None
    assert torch.equal(parts.flat.flat_grad, ref.flat.flat_grad)  # zeroed after the last boundary, in both


def test_each_backward_starts_after_the_previous_one_ended():
    spans: list[tuple[float, float]] = []
    pending = PendingBackward()

    def slow():
        t = time.perf_counter()
        time.sleep(0.05)
        spans.append((t, time.perf_counter()))

    t0 = time.perf_counter()
    pending.start(slow)
    assert time.perf_counter() - t0 < 0.04  # the caller went on while the first one ran
    pending.start(slow)
    pending.wait()
    assert len(spans) == 2 and spans[1][0] >= spans[0][1]
    assert pending._thread is None  # nothing left to wait for


def test_an_error_in_an_overlapped_backward_is_raised_by_the_next_micro_step(one_thread):
    from libreyolo.bench.step import make_runner

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("backward exploded")

    cfg = TrainConfig.from_overrides({"model": "LibreYOLO9t", "imgsz": 64, "batch": 2, "nbs": 8, "device": "cpu"})
    batches, nc = step_batches(cfg, 2, CPU)
    step, parts = make_runner(cfg, CPU, nc, "eager")
    step.overlap_backward = True
    inner = step.loss_fn
    step.loss_fn = lambda *a: (lambda lv: (Boom.apply(lv[0]), lv[1]))(inner(*a))
    b = batches[0]
    step(b["img"], b["targets"], b["mask"], False)  # returns while the backward runs (and fails)
    with pytest.raises(RuntimeError, match="backward exploded"):
        step(b["img"], b["targets"], b["mask"], False)
    step.loss_fn = inner
    step.sync()  # nothing left pending: the error was raised once
    c = batches[1]
    assert torch.isfinite(step(c["img"], c["targets"], c["mask"], True)).all()


@pytest.mark.parametrize(
    "asked,device,flat,accumulate,autobatch,want",
    [
        (True, "cuda", True, 4, False, True),
        (False, "cuda", True, 4, False, False),  # overlap_backward=false
        (True, "cpu", True, 4, False, False),  # a CPU step is compute-bound: two threads would share its cores
        (True, "cuda", False, 4, False, False),  # DDP's wrapper (no flat parameters)
        (True, "cuda", True, 1, False, False),  # a step per batch: each backward ends before the optimizer step
        (True, "cuda", True, 4, True, False),  # autobatch filled the memory for one micro-step's activations
    ],
)
def test_overlap_rule(asked, device, flat, accumulate, autobatch, want):
    cfg = TrainConfig.from_overrides({"overlap_backward": asked})
    step = SimpleNamespace(flat=object() if flat else None)
    assert overlap_wanted(cfg, step, torch.device(device), accumulate, autobatch) is want  # type: ignore[arg-type]


def _train_overlapped(monkeypatch, data, project, overlap, **keys):
    from libreyolo import LibreYOLO
    from libreyolo.engine import builders

    # on a CPU the rule says no: force it, to run the trainer's own path with the backward on the helper
    monkeypatch.setattr(builders, "overlap_wanted", lambda *a: overlap)
    m = LibreYOLO("LibreYOLO9t")
    keys = dict(imgsz=64, batch=4, nbs=16, workers=0, warmup_epochs=0, device="cpu", project=str(project), **keys)
    m.train(data=str(data), epochs=1, **keys)
    return m


def test_a_training_run_with_the_overlapped_backward_saves_the_plain_runs_weights(monkeypatch, tiny_data, tmp_path):
    from libreyolo.engine.checkpoint import load_checkpoint

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = [_train_overlapped(monkeypatch, tiny_data, tmp_path / str(o), o) for o in (False, True)]
    finally:
        torch.set_num_threads(n)
    a, b = (load_checkpoint(m.last_run / "weights" / "last.pt")["model"] for m in runs)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_run_that_fails_inside_an_accumulation_window_leaves_no_backward_running(monkeypatch, tiny_data, tmp_path):
    from libreyolo.engine.step import EagerStep

    def fail_at_first_step(event):
        if event.type == "step":  # the first micro-step's backward is still running on the helper
            raise RuntimeError("callback failed")

    inner = EagerStep._backward

    def slow_backward(self, loss):
        time.sleep(0.5)  # still running when the run unwinds, unless the end of the run waits for it
        inner(self, loss)

    monkeypatch.setattr(EagerStep, "_backward", slow_backward)

    with pytest.raises(RuntimeError, match="callback failed"):
        _train_overlapped(monkeypatch, tiny_data, tmp_path, True, callbacks=[fail_at_first_step])
    assert not [t for t in threading.enumerate() if t.name == "libreyolo-backward"]
