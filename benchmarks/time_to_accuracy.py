"""Time to accuracy of training rules: several `libreyolo train` runs side by side on one GPU, each timed and
split by benchmarks/race.py, then epochs (and optimizer steps) to a few mAP50-95 targets per run.

    python benchmarks/time_to_accuracy.py --out study.jsonl --targets 0.5,0.7 \\
        --setting s800-15:data=/tmp/s800/data.yaml,epochs=15 --setting s8k-2:data=/tmp/s8k.yaml,epochs=2 \\
        --config old:nbs=64 --config auto: -- imgsz=640 batch=16 cache=ram

Every (setting, config) pair runs at once (workers split the CPUs), so a run's wall time here is not what it
takes alone: the table reports epochs to each target, and the docs convert them to time with the per-epoch
cost of a run measured alone."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pairs(spec: str) -> tuple[str, list[str]]:
    name, _, kv = spec.partition(":")
    return name, [x for x in kv.split(",") if x]


def run(name: str, args: list[str], project: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE / "race.py"), "--name", name, "--project", project, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
    return json.loads(line) if line else {"name": name, "rc": out.returncode, "error": out.stdout[-2000:]}


def first_epoch_at(maps: list[float], target: float) -> int | None:
    return next((i + 1 for i, m in enumerate(maps) if m >= target), None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--project", default="/tmp/tta-runs")
    ap.add_argument("--targets", default="0.5,0.7")
    ap.add_argument("--setting", action="append", required=True)
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument("--skip", action="append", default=[], help="a setting-config pair not to run, e.g. s8k-lr2x")
    ap.add_argument("common", nargs="*")
    a = ap.parse_args()
    jobs = [
        (f"{s}-{c}", [*s_args, *c_args]) for s, s_args in map(pairs, a.setting) for c, c_args in map(pairs, a.config)
    ]
    jobs = [j for j in jobs if j[0] not in a.skip]
    workers = max(1, (os.cpu_count() or 2) // len(jobs) - 1)
    targets = [float(t) for t in a.targets.split(",")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda j: run(j[0], [*a.common, f"workers={workers}", *j[1]], a.project), jobs))
    with open(a.out, "a") as f:
        for r in results:
            maps = r.get("map_per_epoch") or []
            r["epochs_to"] = {str(t): first_epoch_at(maps, t) for t in targets}
            f.write(json.dumps(r) + "\n")
            print(
                f"{r['name']:<24} rc {r.get('rc')} final {maps[-1] if maps else None} best {r.get('best_map')} "
                f"epochs to {r['epochs_to']} wall {r.get('wall_s')} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
