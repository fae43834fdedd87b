"""The loss meter behind the progress line and `step` events: its asynchronous read-back must move on
even when the GPU never idles (a GPU-bound cuda_graph=full run), without waiting for it."""

import math

import torch

from libreyolo.engine.meters import LossMeter


class BusyGPU:
    """A CUDA event as a GPU that is always busy sees it: not done when first asked, done by the next log."""

    def __init__(self):
        self.asked = 0

    def query(self):
        self.asked += 1
        return self.asked > 1


class BusyMeter(LossMeter):
    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.asynchronous = True  # the CUDA code path, with the event faked

    def _new_event(self):
        return BusyGPU()


def test_poll_follows_the_losses_when_every_fresh_copy_is_still_in_flight():
    m = BusyMeter()
    m.add(torch.tensor([1.0, 2.0, 3.0]))
    m.add(torch.tensor([3.0, 4.0, 5.0]))
    m.request()
    assert all(math.isnan(v) for v in m.poll())  # the first copy has not landed: nothing to show yet, no wait
    m.add(torch.tensor([5.0, 6.0, 7.0]))
    m.request()  # harvests the landed copy (mean of 2 steps), starts the next
    assert m.poll() == [2.0, 3.0, 4.0]
    m.request()
    assert m.poll() == [3.0, 4.0, 5.0]  # mean of all 3 steps: the display moves on every log interval


def test_cpu_meter_is_exact_at_every_poll_and_reset_starts_over():
    m = LossMeter(torch.device("cpu"))
    for v in (1.0, 3.0):
        m.add(torch.full((3,), v))
        m.request()
    assert m.poll() == [2.0, 2.0, 2.0] and m.final() == [2.0, 2.0, 2.0]
    m.reset()
    m.add(torch.full((3,), 10.0))
    m.request()
    assert m.poll() == [10.0, 10.0, 10.0]


def test_steady_step_time_leaves_out_the_slow_first_step(monkeypatch):
    from libreyolo.engine import meters

    now = [100.0]
    monkeypatch.setattr(meters.time, "perf_counter", lambda: now[0])
    thr = meters.Throughput()
    now[0] += 30.0  # the first step: loader start, cuDNN autotuning, graph capture
    thr.add(8, 0.0)
    assert thr.steady_step_ms == thr.step_ms == 30_000  # one step: nothing better to go on
    for _ in range(4):
        now[0] += 0.02
        thr.add(8, 0.0)
    assert abs(thr.steady_step_ms - 20.0) < 1e-6  # what the remaining steps will cost: the ETA's rate
    assert abs(thr.step_ms - 1000 * 30.08 / 5) < 1e-6  # the epoch mean still counts everything
