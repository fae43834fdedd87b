"""`libreyolo bench val` on CPU: every stage reported, and the numbers add up."""

import json
import os
import subprocess
import sys

from libreyolo.bench.val import STAGES


def _cli(*args):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "libreyolo.cli.main", "bench", "val", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_bench_val_reports_every_stage_and_the_numbers_add_up(tiny_data):
    r = _cli(f"data={tiny_data}", "imgsz=64", "batch=3", "workers=1", "device=cpu", "json=true")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert (
        rep["meta"]["device"] == "cpu"
        and rep["meta"]["batch"] == 3
        and rep["meta"]["conf"] == 0.001
        and rep["meta"]["max_det"] == 300
    )
    assert rep["images"] == 8 and rep["loader"]["images"] == 8 and rep["detections"] > 0
    stages, total = rep["stages"]["seconds"], rep["stages"]["total_s"]
    assert set(stages) == set(STAGES)
    assert all(0 <= s <= total for s in stages.values()) and sum(stages.values()) <= total
    e2e = rep["end_to_end"]
    assert 0 < e2e["time_s"] <= e2e["seconds"] and 0 < e2e["eval_s"] <= e2e["seconds"]
    assert rep["loader"]["img_s"] > 0 and rep["end_to_end"]["img_s"] > 0
    assert set(rep["losses"]) == {"box", "cls", "dfl"} and set(rep["metrics"]) == {
        "precision",
        "recall",
        "map50",
        "map",
    }


def test_bench_val_prints_a_table(tiny_data):
    r = _cli(f"data={tiny_data}", "imgsz=64", "batch=4", "workers=0", "device=cpu", "static=true")
    assert r.returncode == 0, r.stderr[-3000:]
    for word in ("forward", "postprocess", "coco_eval", "end to end", "img/s"):
        assert word in r.stdout
