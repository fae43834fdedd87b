"""libreyolo bench race: its parts read off a run's events, and its keys (the runs themselves are GPU work)."""

import pytest

from libreyolo.bench.race import run, split
from libreyolo.errors import ConfigError


def _events():
    t0 = 100.0
    start = {"type": "run_start", "t": t0 + 2.0, "train_images": 80, "cuda_graph_mode": "full", "accumulate": 1,
             "steps_per_epoch": 10, "optimizer": "AdamW", "batch": 8, "model": "LibreYOLO9t"}  # fmt: skip
    ev = [start]
    for epoch, (begin, last) in enumerate([(103.0, 107.0), (108.0, 110.0)]):
        ev.append({"type": "epoch_start", "t": begin, "epoch": epoch})
        ev += [{"type": "step", "t": begin + 0.5, "epoch": epoch, "step": 1, "steps": 10}]
        ev += [{"type": "step", "t": last, "epoch": epoch, "step": 10, "steps": 10}]
        ev.append({"type": "vram", "t": last + 0.1, "peak_reserved_mb": 2048.0 * (epoch + 1)})
        ev.append({"type": "epoch_end", "t": last + 0.2, "epoch": epoch})
    ev.append({"type": "val", "t": 110.5, "time_s": 0.4, "held_s": 0.1, "eval_s": 0.2})
    ev.append({"type": "graph", "t": 104.0, "action": "capture", "reason": "captured the whole micro step"})
    ev.append({"type": "checkpoint", "t": 110.8})
    return t0, ev


def test_split_reads_the_parts_the_images_per_second_and_the_graph_decisions_off_the_events():
    t0, ev = _events()
    s = split(ev, t0, 111.0)
    # start: launch to the first step event; train: each epoch_start to that epoch's last step event
    assert s["start_s"] == 3.5 and s["train_s"] == pytest.approx((107.0 - 103.0) + (110.0 - 108.0))
    assert s["seams_s"] == 1.0 and s["val_held_s"] == 0.1 and s["epochs"] == 2
    assert s["train_img_s"] == pytest.approx(2 * 80 / 6.0, abs=0.1)
    assert s["graph_actions"] == ["capture"] and s["mode"] == "full" and s["peak_reserved_gb"] == 4.0


@pytest.mark.parametrize(
    "argv,message",
    [
        (["modes=auto,fast"], "modes='fast': choose from auto, full, true, false"),
        (["cuda_graph=full"], "bench race sets cuda_graph"),
        (["epoch=3"], "epoch"),
    ],
)
def test_bad_keys_are_named_before_any_run(argv, message):
    with pytest.raises(ConfigError, match=message):
        run(argv)
