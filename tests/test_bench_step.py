"""`libreyolo bench step` on CPU: the JSON report, the graph modes' one-line fallback, bad modes."""

import json
import os
import random
import subprocess
import sys

from libreyolo.bench.kernels import busy_figures, summarize


def _cli(*args):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "libreyolo.cli.main", "bench", "step", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_bench_step_reports_each_mode_and_graph_modes_fall_back_on_cpu():
    # nbs=6 at batch 2: 3 micro-steps per optimizer step; 25 steps are timed as 27, whole cycles
    r = _cli("device=cpu", "imgsz=64", "batch=2", "nbs=6", "warmup=1", "steps=25", "modes=eager,full", "json=true")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["meta"]["device"] == "cpu" and report["meta"]["batch"] == 2
    assert (report["meta"]["amp"], report["meta"]["amp_dtype"]) == (
        False,
        "float32",
    )  # YOLOv9's amp=true does not run on a CPU
    eager, full = report["results"]
    assert (eager["mode"], full["mode"]) == ("eager", "full")
    for res in (eager, full):
        assert (
            res["steps"] == 27
            and res["accumulate"] == 3
            and 0 < res["min_ms"] <= res["median_ms"]
            and res["warmup_s"] > 0
        )
        # CPU: no CUDA launches to count, and no GPU to be busy
        assert res["kernels_per_step"] == 0 and res["gpu_busy_frac"] is None and res["peak_allocated_gb"] is None
        assert (
            res["gpu_busy_ms_per_step"] is None
            and res["kernel_time_sum_ms_per_step"] is None
            and res["profiled_wall_ms_per_step"] > 0
        )
    assert eager["notes"] == [] and eager["speedup_vs_eager"] == 1.0
    # modes are compared by the steps back to back, not by a single step's median
    assert full["speedup_vs_eager"] == eager["mean_ms"] / full["mean_ms"]
    assert len(full["notes"]) == 1 and "need a CUDA device; training eager on cpu" in full["notes"][0]


def test_bench_step_rejects_an_unknown_mode():
    r = _cli("device=cpu", "modes=eager,turbo")
    assert r.returncode == 2 and "modes='turbo': choose from eager, graph, full, compile" in r.stderr


def test_busy_fraction_counts_overlapping_streams_once_and_never_exceeds_one():
    # two streams: kernels overlap across streams (and one sits inside another), with idle gaps between
    stream_a = [(0.0, 10.0), (12.0, 20.0), (30.0, 31.0)]
    stream_b = [(5.0, 15.0), (13.0, 14.0), (40.0, 50.0)]
    f = busy_figures(stream_a + stream_b, wall_us=60.0, steps=2)
    assert f["gpu_busy_ms_per_step"] * 1000 * 2 == 20.0 + 1.0 + 10.0  # [0, 20), [30, 31), [40, 50)
    assert (
        f["kernel_time_sum_ms_per_step"] * 1000 * 2 == 10 + 8 + 1 + 10 + 1 + 10
    )  # the plain sum: overlaps counted twice
    assert f["gpu_busy_frac"] == 31.0 / 60.0 and f["profiled_wall_ms_per_step"] * 1000 * 2 == 60.0
    # random kernels on two streams inside a window: the union never exceeds the window, the sum may
    rng = random.Random(0)
    for _ in range(200):
        ks = []
        for _stream in range(2):
            t = rng.uniform(0, 5)
            for _ in range(rng.randint(1, 40)):
                d = rng.uniform(0.1, 30)
                ks.append((t, t + d))
                t += d + rng.choice((0.0, rng.uniform(0, 10)))
        wall = max(e for _, e in ks) + rng.uniform(0, 5)
        f = busy_figures(ks, wall, 3)
        assert 0 < f["gpu_busy_frac"] <= 1 + 1e-12
        assert f["gpu_busy_ms_per_step"] <= f["kernel_time_sum_ms_per_step"] + 1e-12
    assert busy_figures([], 0.0, 1)["gpu_busy_frac"] is None


def test_only_kernels_are_counted_not_annotations_or_copies():
    """A Chrome trace of one step: the gpu_user_annotation mirror of a phase range spans the whole step on the
    GPU timeline and must not count as a kernel (it made the busy time the step's span); copies are apart."""
    ev = [
        {"cat": "user_annotation", "name": "phase::forward", "ts": 0.0, "dur": 10.0},
        {"cat": "user_annotation", "name": "phase::backward", "ts": 10.0, "dur": 10.0},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1.0, "dur": 1.0},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 11.0, "dur": 1.0},
        {"cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 12.0, "dur": 1.0},
        {"cat": "gpu_user_annotation", "name": "phase::forward", "ts": 2.0, "dur": 90.0},
        {"cat": "kernel", "name": "conv_fprop", "ts": 3.0, "dur": 4.0},
        {"cat": "kernel", "name": "conv_dgrad", "ts": 13.0, "dur": 4.0},
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20.0, "dur": 2.0},
        {"cat": "gpu_memset", "name": "Memset", "ts": 23.0, "dur": 1.0},
    ]
    r = summarize(ev, steps=1, wall_us=100.0, use_cuda=True)
    assert r["kernels_per_step"] == 2 and r["per_phase"] == {"backward": 1, "forward": 1}
    assert r["gpu_busy_ms_per_step"] == r["kernel_time_sum_ms_per_step"] == 0.008 and r["gpu_busy_frac"] == 0.08
    assert r["copies_per_step"] == 2 and r["copy_time_ms_per_step"] == 0.003
    assert set(r["top_kernels"]) == {"conv_fprop", "conv_dgrad"}


def test_bench_help_shows_the_defaults_the_benchmarks_run_with(capsys, monkeypatch):
    """`bench step` runs batch 8 (TrainConfig says 16) and `bench val` LibreYOLO9t on shapes: --help says so."""
    from libreyolo.bench import step, val

    monkeypatch.setenv("COLUMNS", "200")
    assert step.run(["--help"]) == 0
    rows = _help_defaults(capsys.readouterr().out)
    assert (rows["batch"], rows["imgsz"]) == ("8", "640")
    assert val.run(["--help"]) == 0
    rows = _help_defaults(capsys.readouterr().out)
    assert (rows["model"], rows["data"], rows["imgsz"]) == ("'LibreYOLO9t'", "'shapes'", "640")


def _help_defaults(out: str) -> dict[str, str]:
    return {w[0]: w[1] for w in (line.split() for line in out.splitlines()[2:]) if len(w) > 1}
