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

from libreyolo.bench.race import parts, sample_gpu, split, util_by_part


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
