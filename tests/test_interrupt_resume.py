"""Ctrl-C and SIGTERM in the middle of a step (engine/interrupt.py): the run stops at the next optimizer-step
boundary, and a resume from its last.pt ends bit-identical to the run that was never interrupted: weights, EMA,
BatchNorm statistics, optimizer and every results.csv row (time aside)."""

import csv
import signal

import pytest
import torch
from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.engine.interrupt import raise_interrupt
from libreyolo.events import read_events

# 16 images, batch 4: 4 steps an epoch; nbs 8: an optimizer step every 2 (boundaries after steps 2 and 4)
ARGS = dict(FAST, batch=4, nbs=8, epochs=3, log_interval=1e-6, seed=3, no_aug_epochs=1)


class _SignalMidForward:
    """Sends `sig` to this process from inside the network's forward (after `after` BatchNorm layers ran) in the
    first step of epoch 2: where a KeyboardInterrupt would leave those layers' running statistics updated for a
    step that never finished."""

    def __init__(self, sig, after=10):
        self.sig, self.after = sig, after
        self.epoch, self.steps, self.bn_calls, self.sent = -1, 0, 0, False

    def event(self, e):
        if e.type == "epoch_start":
            self.epoch, self.steps, self.bn_calls = e.epoch, 0, 0
        elif e.type == "step":
            self.steps, self.bn_calls = e.step, 0

    def hook(self, module, args, out):
        if not (isinstance(module, torch.nn.BatchNorm2d) and module.training and torch.is_grad_enabled()):
            return
        self.bn_calls += 1
        if (self.epoch, self.steps, self.bn_calls) == (1, 0, self.after) and not self.sent:
            self.sent = True
            signal.raise_signal(self.sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_step_stops_at_the_boundary_and_the_resume_is_bit_identical(tiny_data, tmp_path, sig):
    full = LibreYOLO("LibreYOLO9t")
    full.train(data=str(tiny_data), project=str(tmp_path / "a"), **ARGS)

    sender = _SignalMidForward(sig)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupt)  # as `libreyolo train` installs it
    handle = torch.nn.modules.module.register_module_forward_hook(sender.hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            LibreYOLO("LibreYOLO9t").train(
                data=str(tiny_data), project=str(tmp_path / "b"), callbacks=[sender.event], **ARGS
            )
        # the trainer put back the handlers it found
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is raise_interrupt
    finally:
        handle.remove()
        for s, h in saved.items():
            signal.signal(s, h)
    assert sender.sent

    last = tmp_path / "b" / "exp" / "weights" / "last.pt"
    ck = load_checkpoint(last)
    assert (ck["epoch"], ck["step"]) == (
        1,
        2,
    )  # signalled in epoch 2's first step: stopped after its second, a boundary
    events = list(read_events(last.parent.parent / "events.jsonl"))
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "interrupted"
    notes = [e["message"] for e in events if e["type"] == "warning" and e.get("code") == "signal"]
    assert notes == [f"{sig.name}: stopping at epoch 2, step 2, an optimizer-step boundary; last.pt is saved there "
                     "and resume= continues exactly"]  # fmt: skip

    LibreYOLO(last).train(resume=True, model=str(last))
    a = load_checkpoint(tmp_path / "a" / "exp" / "weights" / "last.pt")
    b = load_checkpoint(last)
    assert (a["epoch"], b["epoch"]) == (3, 3)
    for part, x, y in (("model", a["model"], b["model"]), ("train net", a["train"]["net"], b["train"]["net"])):
        assert x.keys() == y.keys()
        for k in x:  # BatchNorm running statistics included (the train net's buffers)
            torch.testing.assert_close(x[k], y[k], rtol=0, atol=0, msg=f"{part}: {k}")
    ox, oy = a["train"]["optimizer"]["state"], b["train"]["optimizer"]["state"]
    for k in ox:
        for name, v in ox[k].items():
            torch.testing.assert_close(v, oy[k][name], rtol=0, atol=0, msg=f"optimizer {k} {name}")
    rows_a = list(csv.DictReader(open(tmp_path / "a" / "exp" / "results.csv")))
    rows_b = list(csv.DictReader(open(tmp_path / "b" / "exp" / "results.csv")))
    assert len(rows_a) == len(rows_b) == 3
    for ra, rb in zip(rows_a, rows_b):
        assert _untimed(ra) == _untimed(rb)


def _untimed(row: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in row.items() if k.strip() != "time"}
