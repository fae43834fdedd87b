"""A resumed run may change its experiment trackers (engine/setup.py's RESUME_OVERRIDABLE holds mlflow and wandb):
they only watch the run, and a resume on a machine without the package or the server must be able to drop one. A
resume that does not name the key keeps the checkpoint's value. Recording stand-ins take the backends' place."""

from __future__ import annotations

import pytest
from conftest import FAST

from libreyolo import LibreYOLO, trackers
from libreyolo.engine.checkpoint import load_checkpoint
from libreyolo.engine.setup import RESUME_OVERRIDABLE
from libreyolo.events import read_events

THREE_EPOCHS = dict(FAST, epochs=3, warmup_epochs=0, plots=False)


class Recording:
    """A tracker backend that only notes what it was asked (one per process: `made` collects them)."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, []

    def start(self, run_dir, project, params, resumed):
        self.calls.append(("start", resumed))

    def metrics(self, values, epoch):
        self.calls.append(("metrics", epoch))

    def artifacts(self, files):
        self.calls.append(("artifacts", None))

    def finish(self, status):
        self.calls.append(("finish", status))


class StopAt:
    """Ctrl-C as epoch `epoch` starts."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, e) -> None:
        if e.type == "epoch_start" and e.epoch == self.epoch:
            raise KeyboardInterrupt


def test_a_resume_keeps_wandb_unless_told_and_wandb_false_turns_it_off(tiny_data, tmp_path, monkeypatch) -> None:
    assert {"mlflow", "wandb"} <= RESUME_OVERRIDABLE
    made: list[Recording] = []
    monkeypatch.setattr(trackers, "backend", lambda key: made.append(Recording(key)) or made[-1])
    monkeypatch.setattr(trackers, "require", lambda cfg: None)  # the stand-in needs no package

    with pytest.raises(KeyboardInterrupt):  # 1st process: wandb=true, stopped as the 2nd epoch starts
        LibreYOLO("LibreYOLO9t").train(
            data=str(tiny_data), project=str(tmp_path), wandb=True, callbacks=[StopAt(1)], **THREE_EPOCHS
        )
    last = tmp_path / "exp" / "weights" / "last.pt"
    with pytest.raises(KeyboardInterrupt):  # 2nd: the key not given: the checkpoint's wandb=true goes on
        LibreYOLO(last).train(resume=True, model=str(last), callbacks=[StopAt(2)])
    saved = load_checkpoint(last)["train_args"]  # the resumed run saved its own keys, not the defaults it began from
    assert (saved["epochs"], saved["imgsz"], saved["batch"], saved["wandb"]) == (3, FAST["imgsz"], FAST["batch"], True)
    LibreYOLO(last).train(resume=True, model=str(last), wandb=False)  # 3rd: turned off, to the end

    assert [b.name for b in made] == ["wandb", "wandb"]  # no tracker at all in the 3rd process
    first, second = made
    # (a tracker's step is the 1-based epoch)
    assert first.calls[0] == ("start", False) and {c for c in first.calls if c[0] == "metrics"} == {("metrics", 1)}
    assert second.calls[0] == ("start", True) and {c for c in second.calls if c[0] == "metrics"} == {("metrics", 2)}
    events = list(read_events(tmp_path / "exp" / "events.jsonl"))
    starts = [e for e in events if e["type"] == "run_start"]
    assert [(e["start_epoch"], e["config"]["wandb"]) for e in starts] == [(0, True), (1, True), (2, False)]
    assert [e["status"] for e in events if e["type"] == "run_end"] == ["interrupted", "interrupted", "finished"]
