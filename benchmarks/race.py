"""Time one `libreyolo train` run from launch to exit and split it into parts from its events.

    python benchmarks/race.py --name default -- data=/tmp/s800/data.yaml epochs=15 imgsz=640 batch=16 [key=value ...]

Prints one JSON line: launch-to-exit wall time; start (launch to the end of the first training step, read off
the first step event, which the trainer emits right after a run's first step); the training parts of the
epochs (epoch_start to the epoch's last step event); the seams between epochs (an epoch's last step event to the
next epoch_start); validation as it held the loop (val.held_s; val.time_s in files before schema 4), its forward,
loss and NMS (val.time_s, on a GPU beside the next epoch's steps) and the COCO evaluation (val.eval_s, possibly
overlapped with training); end (the last checkpoint event to exit); the
mean GPU utilisation NVML reported, sampled every 0.5 s from launch to exit, over the whole run and over the
samples inside each part (start, train, seams, and end from the last step event); the final and best
metrics; and whether torch's bytecode was cached (a start that compiles torch from source is ~2 s longer on the
H200)."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import threading
import time
from pathlib import Path


def sample_gpu(stop: threading.Event, out: list[tuple[float, float]], period: float = 0.5) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no NVIDIA driver: utilisation stays unknown
        return
    while not stop.wait(period):
        out.append((time.time(), float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)))


def epoch_spans(events: list[dict]) -> list[tuple[float, float, float | None]]:
    """Per epoch that reached its last step: (its epoch_start, its last step event, the next epoch_start or None)."""
    steps = [e for e in events if e["type"] == "step"]
    starts = [e for e in events if e["type"] == "epoch_start"]
    out = []
    for es in starts:
        last = [s["t"] for s in steps if s["epoch"] == es["epoch"] and s["step"] == s["steps"]]
        if last:
            after = [n["t"] for n in starts if n["epoch"] == es["epoch"] + 1]
            out.append((es["t"], last[-1], after[0] if after else None))
    return out


def parts(events: list[dict], launch: float, exit_t: float) -> dict[str, list[tuple[float, float]]]:
    """The run's wall-clock intervals by part: start (launch to the first step event), train (each epoch_start to
    its last step event), seams (an epoch's last step event to the next epoch_start), end (the last step event
    to exit)."""
    steps = [e for e in events if e["type"] == "step"]
    out: dict[str, list[tuple[float, float]]] = {"start": [], "train": [], "seams": [], "end": []}
    if not steps:
        return out
    out["start"].append((launch, steps[0]["t"]))
    for begin, last, after in epoch_spans(events):
        out["train"].append((max(begin, steps[0]["t"]), last))
        if after is not None:
            out["seams"].append((last, after))
    out["end"].append((steps[-1]["t"], exit_t))
    return out


def util_by_part(samples: list[tuple[float, float]], spans: dict[str, list[tuple[float, float]]]) -> dict:
    """Mean NVML utilisation of the samples taken inside each part. NVML's figure at a sample is the share of its
    own last averaging window (1/6 to 1 s) in which a kernel ran, so a short part borrows from its neighbours."""
    res: dict[str, float | None] = {}
    for name, ivs in spans.items():
        inside = [u for t, u in samples if any(a <= t < b for a, b in ivs)]
        res[name] = round(sum(inside) / len(inside), 1) if inside else None
    return res


def split(events: list[dict], launch: float, exit_t: float) -> dict:
    by = lambda kind: [e for e in events if e["type"] == kind]  # noqa: E731
    steps, vals = by("step"), by("val")
    first_step = steps[0]["t"] if steps else None
    spans = epoch_spans(events)
    train = sum(last - begin for begin, last, _ in spans)
    seams = sum(after - last for _, last, after in spans if after is not None)
    ckpts = by("checkpoint")
    return {
        "start_s": round(first_step - launch, 2) if first_step else None,
        "run_start_s": round(by("run_start")[0]["t"] - launch, 2),
        "train_s": round(train, 2),
        "seams_s": round(seams, 2),
        "val_held_s": round(sum(v.get("held_s", v["time_s"]) for v in vals), 2),
        "val_device_s": round(sum(v["time_s"] for v in vals), 2),
        "val_eval_s": round(sum(v.get("eval_s", 0.0) for v in vals), 2),
        "val_per_epoch_s": [round(v["time_s"], 3) for v in vals],
        # epoch_start to the next epoch_start (the last: to its last step event): the first epochs' captures show here
        "epoch_s": [
            round((spans[i + 1][0] if i + 1 < len(spans) else last) - begin, 3)
            for i, (begin, last, _) in enumerate(spans)
        ],
        "end_s": round(exit_t - max(c["t"] for c in ckpts), 2) if ckpts else None,
        "run_end_to_exit_s": round(exit_t - by("run_end")[-1]["t"], 2) if by("run_end") else None,
        "epochs": len(by("epoch_end")),
        "graph": [f"{g['action']}: {g['reason']}" for g in by("graph")],
        "amp": [a["reason"] for a in by("amp")],
        "mode": by("run_start")[0].get("cuda_graph_mode"),
        **{k: by("run_start")[0][k] for k in ("accumulate", "steps_per_epoch", "optimizer", "batch")},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--project", default="/tmp/race-runs")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    cmd = [
        sys.executable,
        "-m",
        "libreyolo.cli.main",
        "train",
        *a.args,
        f"project={a.project}",
        f"name={a.name}",
        "exist_ok=true",
    ]
    run_dir = Path(a.project) / a.name
    if (run_dir / "events.jsonl").exists():
        (run_dir / "events.jsonl").unlink()
    (run_dir / "results.csv").unlink(missing_ok=True)
    util: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_gpu, args=(stop, util), daemon=True)
    launch = time.time()
    sampler.start()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    exit_t = time.time()
    stop.set()
    sampler.join()
    (run_dir / "stdout.txt").write_text(proc.stdout)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    with open(run_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    m = lambda r: {k.split("/")[-1].strip(): float(v) for k, v in r.items() if k.startswith("metrics/")}  # noqa: E731
    out = {
        "name": a.name,
        "rc": proc.returncode,
        "wall_s": round(exit_t - launch, 2),
        **split(events, launch, exit_t),
        "gpu_util_mean": round(sum(u for _, u in util) / len(util), 1) if util else None,
        "gpu_util_by_part": util_by_part(util, parts(events, launch, exit_t)),
        "gpu_util_samples": [[round(t - launch, 2), u] for t, u in util],
        "final": m(rows[-1]) if rows else None,
        "best_map": max(float(r["metrics/mAP50-95(B)"]) for r in rows) if rows else None,
        "map_per_epoch": [round(float(r["metrics/mAP50-95(B)"]), 4) for r in rows],
        "args": a.args,
        # False: torch has no bytecode cache (the setup's note), so every start compiles it from source and is not
        # comparable with one that reads the cache (`import torch` 3.4-3.7 s against 1.6-1.9 s on the H200's image);
        # True also for the one process that wrote the cache
        "torch_bytecode_cached": "has no bytecode cache" not in proc.stdout,
    }
    if not out["torch_bytecode_cached"]:
        print("race: torch has no bytecode cache here; this start includes compiling it", file=sys.stderr)
    print(json.dumps(out))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
