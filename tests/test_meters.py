"""The loss meter behind the progress line and `step` events: its asynchronous read-back must move on
even when the GPU never idles (a GPU-bound cuda_graph=full run), without waiting for it."""

import torch
from conftest import run_start_event

from libreyolo.engine.meters import HostRead, LossMeter


class BusyGPU:
    """A CUDA event as a GPU that is always busy sees it: not done when first asked, done by the next log."""

    def __init__(self):
        self.asked = 0

    def query(self):
        self.asked += 1
        return self.asked > 1


class BusyMeter(LossMeter):
    def __init__(self):
        super().__init__(torch.device("cpu"), 3)
        self.asynchronous = True  # the CUDA code path, with the event faked

    def _new_event(self):
        return BusyGPU()


def test_poll_follows_the_losses_when_every_fresh_copy_is_still_in_flight():
    m = BusyMeter()
    m.add(torch.tensor([1.0, 2.0, 3.0]))
    m.add(torch.tensor([3.0, 4.0, 5.0]))
    m.request()
    assert m.poll() == []  # the first copy has not landed: nothing to show yet, no wait
    m.add(torch.tensor([5.0, 6.0, 7.0]))
    m.request()  # harvests the landed copy (mean of 2 steps), starts the next
    assert m.poll() == [2.0, 3.0, 4.0]
    m.request()
    assert m.poll() == [3.0, 4.0, 5.0]  # mean of all 3 steps: the display moves on every log interval


def test_a_new_epoch_shows_no_losses_until_its_own_copy_lands():
    m = BusyMeter()
    m.add(torch.tensor([1.0, 1.0, 1.0]))
    m.request()
    m.request()
    assert m.poll() == [1.0, 1.0, 1.0]
    m.reset()  # next epoch
    m.add(torch.tensor([9.0, 9.0, 9.0]))
    m.request()
    assert m.poll() == []  # not the previous epoch's means under the new epoch's step number
    m.request()
    assert m.poll() == [9.0, 9.0, 9.0]


def test_cpu_meter_is_exact_at_every_poll_and_reset_starts_over():
    m = LossMeter(torch.device("cpu"), 3)
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


def test_progress_line_shows_dashes_not_stale_or_zero_losses_before_the_first_read_back():
    import io

    from rich.console import Console

    from libreyolo import events as ev
    from libreyolo.render import RichRenderer

    out = io.StringIO()
    r = RichRenderer(plain=True, console=Console(file=out, width=200), plain_every_s=0)
    # the terms come from run_start: the renderer knows them before the first loss has been read back
    r(run_start_event(epochs=1, accumulate=1, cuda_graph_reason="cuda_graph=auto: cpu"))
    r(ev.EpochStart(epoch=0, epochs=1, steps=2, mosaic=False))
    for step, losses in ((1, {}), (2, {"box": 0.5, "cls": 1.25, "dfl": 2.0})):
        r(
            ev.Step(
                epoch=0,
                step=step,
                steps=2,
                losses=losses,
                lr=0.01,
                img_s=10.0,
                data_frac=0.0,
                step_ms=1.0,
                gpu_mem_gb=0.0,
                eta_s=0.0,
            )
        )
    lines = [ln for ln in out.getvalue().splitlines() if "img/s" in ln]
    assert "box - cls - dfl -" in lines[0] and "box 0.500 cls 1.250 dfl 2.000" in lines[1]


def test_host_read_gives_by_name_copies_of_the_values_it_was_given():
    """The epoch's end reads its loss sums and loss-scale figures this way: the values when the read was made (later
    in-place updates, the next epoch's reset, do not reach them), each in its own dtype; a name given None is left
    out."""
    sums, skipped = torch.tensor([1.5, 2.5]), torch.tensor(3, dtype=torch.int32)
    read = HostRead({"sum": sums, "scale": None, "skipped": skipped})
    sums.zero_()
    skipped.add_(1)
    got = read.get()
    assert list(got) == ["sum", "skipped"]
    assert torch.equal(got["sum"], torch.tensor([1.5, 2.5])) and got["skipped"].dtype == torch.int32
    assert int(got["skipped"]) == 3 and read.get() is got
