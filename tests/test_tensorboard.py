"""tensorboard=true: scalars fed by the event stream into <run dir>/tensorboard; a clear error without the package."""

import importlib.util

import pytest
from conftest import FAST

from libreyolo import LibreYOLO
from libreyolo.cli.main import main
from libreyolo.config import TrainConfig
from libreyolo.errors import ConfigError
from libreyolo.events import read_events


def test_tensorboard_scalars_per_loss_term_metrics_and_lr(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason='tensorboard is not installed: pip install "libreyolo[tensorboard]"')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert TrainConfig().tensorboard is False
    m = LibreYOLO("LibreYOLO9t")
    m.train(data=str(tiny_data), project=str(tmp_path), epochs=2, no_aug_epochs=1, tensorboard=True, **FAST)
    files = list((m.last_run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(files[0]))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    terms = m.family.loss_terms  # box, cls, dfl: the terms the family declares
    want = {f"{split}/{t}_loss" for split in ("train", "val", "step") for t in terms}
    want |= {"metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)"}
    want |= {"lr/pg0", "lr/pg1", "lr/pg2", "step/lr", "step/img_s", "speed/img_s"}
    assert want <= tags, want - tags
    assert "step/gpu_mem_gb" not in tags  # CPU: no GPU memory to plot
    events = list(read_events(m.last_run / "events.jsonl"))
    ends = [e for e in events if e["type"] == "epoch_end"]
    vals = [e for e in events if e["type"] == "val"]
    for t in terms:  # the same numbers as the event stream, at epoch 1, 2
        got = [(s.step, s.value) for s in acc.Scalars(f"train/{t}_loss")]
        assert got == [(e["epoch"] + 1, pytest.approx(e["losses"][t], rel=1e-6)) for e in ends]
    got = [(s.step, s.value) for s in acc.Scalars("metrics/mAP50-95(B)")]
    assert got == [(e["epoch"] + 1, pytest.approx(e["map"], rel=1e-6, abs=1e-9)) for e in vals]


def test_tensorboard_without_the_package_says_how_to_install_it(tiny_data, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    hint = 'pip install "libreyolo[tensorboard]"'
    with pytest.raises(ConfigError, match=r"tensorboard=true needs the tensorboard package: pip install"):
        LibreYOLO("LibreYOLO9t").train(data=str(tiny_data), project=str(tmp_path), epochs=1, tensorboard=True, **FAST)
    assert not list(tmp_path.iterdir())  # refused before a run folder was made
    argv = ["train", f"data={tiny_data}", f"project={tmp_path}", "epochs=1", "device=cpu", "tensorboard=true"]
    assert main(argv) == 2
    assert hint in capsys.readouterr().err
