"""`libreyolo bench step` on CPU: the JSON report, the graph modes' one-line fallback, bad modes."""

import json
import os
import subprocess
import sys


def _cli(*args):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "libreyolo.cli.main", "bench", "step", *args], capture_output=True, text=True, env=env, timeout=600)


def test_bench_step_reports_each_mode_and_graph_modes_fall_back_on_cpu():
    r = _cli("device=cpu", "imgsz=64", "batch=2", "nbs=4", "warmup=1", "steps=24", "modes=eager,full", "json=true")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["meta"]["device"] == "cpu" and report["meta"]["batch"] == 2
    assert (report["meta"]["amp"], report["meta"]["amp_dtype"]) == (False, "float32")  # YOLOv9's amp=true does not run on a CPU
    eager, full = report["results"]
    assert (eager["mode"], full["mode"]) == ("eager", "full")
    for res in (eager, full):
        assert res["steps"] == 24 and res["accumulate"] == 2 and 0 < res["min_ms"] <= res["median_ms"] and res["warmup_s"] > 0
        # CPU: no CUDA launches to count, and no GPU to be busy
        assert res["kernels_per_step"] == 0 and res["gpu_busy_frac"] is None and res["peak_allocated_gb"] is None
    assert eager["notes"] == [] and eager["speedup_vs_eager"] == 1.0
    assert len(full["notes"]) == 1 and "need a CUDA device; training eager on cpu" in full["notes"][0]


def test_bench_step_rejects_an_unknown_mode():
    r = _cli("device=cpu", "modes=eager,turbo")
    assert r.returncode == 2 and "modes='turbo': choose from eager, graph, full, compile" in r.stderr
