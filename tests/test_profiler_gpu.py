"""The four verdicts on a real GPU, each from a case constructed to produce it, and --try on host/launch.

Run on the device machine: python -m pytest -m gpu tests/test_profiler_gpu.py -s -v
Each case prints one line (verdict, step time, img/s, utilization) for docs/performance.md."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from libreyolo.profiler.schema import load_profile

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    """256 shapes images of 160 px: enough steps for every window inside the first epochs."""
    from libreyolo.data.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("gpu") / "shapes", n_train=256, n_val=8, size=160)


@pytest.fixture(scope="module")
def gpu_data_1k(tmp_path_factory):
    """1,024 images of 160 px: a window of 13 steps at batch 64 inside one epoch (no epoch-start refills)."""
    from libreyolo.data.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("gpu1k") / "shapes", n_train=1024, n_val=8, size=160)


def profile_run(data, project, *args, env=None):
    cmd = [
        sys.executable,
        "-m",
        "libreyolo.cli.main",
        "profile",
        "run",
        str(data),
        "--device",
        "0",
        "--json",
        "--project",
        str(project),
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout)


def show(case, p):
    h = p["headline"]
    util = "n/a" if h["utilization"] is None else f"{100 * h['utilization']:.0f}%"
    print(
        f"\n[{case}] {p['meta']['device_name']}: verdict {p['verdict']['name']!r}; step {h['step_ms']:.2f} ms, "
        f"{h['img_s']:.0f} img/s, "
        f"utilization {util}, {h['kernels_per_step']:.0f} kernels/step (mean {h['mean_kernel_us']:.1f} µs), data wait "
        f"{100 * h['data_frac']:.0f}%, {h['alloc_calls_per_step']:.1f} cudaMalloc/Free per step\n  why: "
        f"{p['verdict']['why']}"
    )


def test_sleeping_loader_is_dataloader(gpu_data, tmp_path, monkeypatch):
    import libreyolo.engine.setup as setup
    from libreyolo.profiler.run import profile_once

    class Sleepy(setup.YOLODataset):
        def __getitem__(self, key):
            if self.augment:
                time.sleep(0.02)  # 8 images: 160 ms of 'loading' per batch, far above the GPU's step
            return super().__getitem__(key)

    monkeypatch.setattr(setup, "YOLODataset", Sleepy)
    p = profile_once(
        dict(
            data=str(gpu_data),
            model="LibreYOLO9t",
            batch=8,
            imgsz=128,
            workers=0,
            device="0",
            nbs=8,
            profile_warmup=3,
            profile_steps=10,
        ),
        tmp_path,
        "sleepy",
    )
    show("dataloader", p)
    assert p["verdict"]["name"] == "dataloader" and p["headline"]["data_frac"] >= 0.2
    assert p["headline"]["utilization"] is not None  # kernels were recorded: the verdict is not a fallback


def test_tiny_model_at_batch_1_is_host_launch_and_try_measures_cuda_graph(gpu_data, tmp_path):
    # nbs=1: an optimizer step every step, as a batch-1 user would also get with accumulation to 64 after 64 steps
    r = profile_run(
        gpu_data,
        tmp_path,
        "--model",
        "LibreYOLO9t",
        "--batch",
        "1",
        "--imgsz",
        "64",
        "--workers",
        "2",
        "--try",
        "nbs=1",
    )
    p = load_profile(r["run_dir"])
    show("host / launch", p)
    h = p["headline"]
    assert p["verdict"]["name"] == "host / launch" and h["utilization"] < 0.8
    assert f"{h['kernels_per_step']:.0f} kernels per step" in p["verdict"]["why"] and h["kernels_per_step"] > 100
    # a CUDA trace, analysed: kernels by category, GPU time per phase, GPU lanes in the timeline
    assert {c["name"] for c in p["categories"]} >= {"conv", "elementwise"}
    phases = {r["name"]: r for r in p["phases"]}
    assert phases["forward"]["gpu_ms"] > 0 and phases["backward"]["gpu_ms"] > 0
    p_dir = Path(r["run_dir"])
    trace = json.loads((p_dir / "profile_trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    assert (
        json.dumps("GPU kernels · stream")[1:-1] in (p_dir / "timeline.html").read_text()
    )  # lane names sit in the page's JSON
    t = r["try"]
    assert t["lever"] == {"cuda_graph": True} and t["after"] is not None and t["speedup"] > 0
    assert load_profile(p_dir / "try")["meta"]["cuda_graph"] == "true"
    print(
        f"  --try cuda_graph=true: {t['before']['step_ms']['mean']:.2f} -> {t['after']['step_ms']['mean']:.2f} "
        "ms/step, "
        f"{t['before']['img_s']['mean']:.0f} -> {t['after']['img_s']['mean']:.0f} img/s ({t['speedup']:.2f}x)"
    )


def test_large_batch_at_640_is_compute(gpu_data_1k, tmp_path):
    workers = str(min(16, os.cpu_count() or 1))
    # float32 (no scaler sync, the most GPU work per image), no mosaic and the RAM cache: the loader keeps up, the GPU
    # is
    # the limit. With 256 images (4 steps an epoch) every epoch start refilled the loader and the verdict was
    # dataloader.
    r = profile_run(
        gpu_data_1k,
        tmp_path,
        "--model",
        "LibreYOLO9s",
        "--batch",
        "64",
        "--imgsz",
        "640",
        "--workers",
        workers,
        "--no-amp",
        "--steps",
        "10",
        "--warmup",
        "3",
        "mosaic=0",
        "nbs=64",
        "cache=ram",
    )
    p = load_profile(r["run_dir"])
    show("compute", p)
    assert p["verdict"]["name"] == "compute" and p["headline"]["utilization"] >= 0.8
    assert p["verdict"]["try"] == {"amp": True, "amp_dtype": "bfloat16"}


def test_allocator_churn_is_memory_pressure(gpu_data, tmp_path):
    # without the caching allocator every tensor is a cudaMalloc and a cudaFree: thrash by construction
    r = profile_run(
        gpu_data,
        tmp_path,
        "--model",
        "LibreYOLO9t",
        "--batch",
        "8",
        "--imgsz",
        "128",
        "--workers",
        "2",
        "nbs=8",
        env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    )
    p = load_profile(r["run_dir"])
    show("memory-pressure", p)
    assert p["verdict"]["name"] == "memory-pressure" and p["headline"]["alloc_calls_per_step"] >= 5
    assert "unreliable" in p["verdict"]["why"]
