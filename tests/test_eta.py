"""The time-left estimate shared by the headless renderer and the console (libreyolo/eta.py)."""

import io

from conftest import run_start_event
from rich.console import Console

from libreyolo import events as ev
from libreyolo.eta import ESTIMATING, EtaEstimator, fmt_range, steps_left
from libreyolo.render import RichRenderer

EPOCHS, STEPS = 10, 20


def _feed(est: EtaEstimator, per_step: list[float], epoch: int = 0) -> list[str]:
    """One step event per entry, each reporting the trainer's eta_s at that per-step time; -> est.text() after each."""
    out = []
    for i, sec in enumerate(per_step, start=1):
        step = i % STEPS or STEPS
        ep = epoch + (i - 1) // STEPS
        est.update(ep, step, STEPS, EPOCHS, sec * steps_left(ep, step, STEPS, EPOCHS))
        out.append(est.text())
    return out


def test_a_slow_start_shows_estimating_not_hours():
    # a CPU run: the first steps pay for the dataset scan, the workers and the warm-up (25 s, then 8 s), then 1 s/step
    texts = _feed(EtaEstimator(), [25.0, 8.0, 3.0, 1.0, 1.05, 0.98, 1.02, 1.0, 1.01])
    assert texts[:6] == [ESTIMATING] * 6  # never "hours" from the first steps
    est = EtaEstimator()
    _feed(est, [25.0, 8.0, 3.0, 1.0, 1.05, 0.98, 1.02, 1.0, 1.01])
    lo, hi = est.estimate()
    left = steps_left(0, 9, STEPS, EPOCHS)  # 191 steps at about 1 s
    assert lo <= left <= hi and hi / lo < 1.25
    assert texts[-1] == fmt_range(lo, hi) == "3-4 min"


def test_rates_that_keep_jumping_stay_estimating_and_steady_ones_latch():
    assert set(_feed(EtaEstimator(), [1.0, 3.0] * 10)) == {ESTIMATING}
    est = EtaEstimator()
    _feed(est, [1.0] * 8)
    assert est.steady
    _feed(est, [1.0, 2.0, 1.0], epoch=1)  # a slow patch widens the range, it does not go back to estimating
    lo, hi = est.estimate()
    assert est.steady and hi / lo >= 1.9


def test_the_epoch_s_first_step_and_a_resume_are_not_samples():
    est = EtaEstimator()
    for epoch in range(6):  # only the first step of each epoch (wildly slow) arrives: nothing usable
        est.update(epoch, 1, STEPS, EPOCHS, 100.0 * steps_left(epoch, 1, STEPS, EPOCHS))
    assert est.text() == ESTIMATING
    _feed(est, [1.0] * 8)
    assert est.steady
    est.reset()  # run_start of a resumed process
    assert est.text() == ESTIMATING and est.estimate() is None


def test_ranges_read_in_one_unit():
    assert fmt_range(250, 330) == "4-6 min"
    assert fmt_range(41, 48) == "40-50 s"
    assert fmt_range(300, 300) == "about 5 min"
    assert fmt_range(5400, 7300) == "1.5-2.1 h"
    assert fmt_range(0, 0) == "0-5 s"


def _run_start() -> ev.RunStart:
    return run_start_event(
        nc=3,
        names=["a", "b", "c"],
        data="shapes",
        epochs=EPOCHS,
        accumulate=1,
        cuda_graph_reason="eager on cpu",
        optimizer="SGD",
        steps_per_epoch=STEPS,
        train_images=160,
        val_images=32,
        params=1_000_000,
    )


def test_the_headless_renderer_says_estimating_then_a_range():
    out = io.StringIO()
    r = RichRenderer(plain=True, console=Console(file=out, width=200), plain_every_s=0.0)
    r(_run_start())
    for i, sec in enumerate([25.0, 8.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], start=1):
        eta = sec * steps_left(0, i, STEPS, EPOCHS)
        r(ev.Step(epoch=0, step=i, steps=STEPS, losses={}, lr=0.01, img_s=8.0, data_frac=0.0,
                  step_ms=sec * 1000, gpu_mem_gb=0.0, eta_s=eta))  # fmt: skip
    lines = [line for line in out.getvalue().splitlines() if line.startswith("  [1/10]")]
    assert len(lines) == 9
    assert all(line.endswith("eta " + ESTIMATING) for line in lines[:6])
    assert lines[-1].endswith("eta 3-4 min")  # 191 s left


def test_the_console_s_progress_line_uses_the_same_estimate():
    from libreyolo_console.state import RunState
    from libreyolo_console.widgets.progress import ProgressPanel

    state, panel = RunState(), ProgressPanel()
    state.apply([_run_start().to_dict()])
    seen = []
    for i, sec in enumerate([25.0, 8.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], start=1):
        eta = sec * steps_left(0, i, STEPS, EPOCHS)
        step = ev.Step(epoch=0, step=i, steps=STEPS, losses={}, lr=0.01, img_s=8.0, data_frac=0.0,
                       step_ms=sec * 1000, gpu_mem_gb=0.0, eta_s=eta)  # fmt: skip
        state.apply([step.to_dict()])
        panel.show_state(state)
        seen.append(str(panel.render()).splitlines()[0])
    assert all(line.endswith("ETA " + ESTIMATING) for line in seen[:6]), seen
    assert seen[-1].endswith("ETA 3-4 min")


def test_the_renderer_prints_messages_and_paths_with_brackets_as_they_are():
    """Text from outside (a Gloo error names its source as `[/__w/.../pair.cc:561]`, a file may be `img[1].jpg`)
    is printed literally: read as rich markup, the closing tag stopped the run's error report with a MarkupError."""
    out = io.StringIO()
    r = RichRenderer(plain=True, console=Console(file=out, width=300))
    gloo = "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed"
    r(ev.ErrorEvent(gloo))
    r(ev.WarningEvent("skipped unreadable image data/[red]img[1].jpg"))
    r(ev.Checkpoint(path="runs/[b]/weights/best.pt", kind="best", epoch=1, step=0))
    text = out.getvalue()
    assert "error: " + gloo in text and "warning: skipped unreadable image data/[red]img[1].jpg" in text
    assert "saved best -> runs/[b]/weights/best.pt" in text
