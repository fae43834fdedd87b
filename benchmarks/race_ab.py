"""Races of two code trees, alternating on one machine, and a table of their parts (benchmarks/race.py per run).

    git archive OLD_COMMIT | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python benchmarks/race_ab.py --tree new=. --tree old=/tmp/old --rounds 3 --out /tmp/ab.jsonl -- \\
        data=/tmp/s800/data.yaml epochs=15 imgsz=640 batch=16

Each round runs every tree once, in the order given, then in reverse in the next round (so that neither always runs
first on a machine that warms up). A tree runs as its own code: race.py and `libreyolo` are taken from the tree (its
directory first on PYTHONPATH, the working directory the tree's). Every run's JSON line goes to --out as it lands;
the table gives each part's values per tree and their mean. Machines differ by more than most changes do: compare
trees within one call, never across calls."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

COLUMNS = ("wall_s", "start_s", "train_s", "seams_s", "end_s", "gpu_util_mean", "best_map")


def run_tree(name: str, tree: Path, index: int, race_args: list[str]) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    cmd = [sys.executable, str(tree / "benchmarks" / "race.py"), "--name", f"{name}{index}", "--", *race_args]
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"tree": name, "rc": proc.returncode, "error": proc.stdout[-2000:]}
    return {"tree": name, **json.loads(lines[-1])}


def table(results: list[dict], names: list[str]) -> str:
    rows = [f"| tree | {' | '.join(COLUMNS)} |", "|" + " --- |" * (len(COLUMNS) + 1)]
    for name in names:
        mine = [r for r in results if r["tree"] == name and "error" not in r]
        cells = []
        for col in COLUMNS:
            values = [r[col] for r in mine if r.get(col) is not None]
            cells.append(
                ", ".join(f"{v:g}" for v in values) + (f" (mean {statistics.mean(values):.4g})" if values else "")
            )
        failed = sum(1 for r in results if r["tree"] == name and "error" in r)
        rows.append(f"| {name}{f' ({failed} failed)' if failed else ''} | {' | '.join(cells)} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, a checkout or `git archive` of a commit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True, help="every run's JSON line, appended as it lands")
    ap.add_argument("race_args", nargs="+", help="after --: the race's train keys (data=... epochs=... ...)")
    a = ap.parse_args()
    trees = []
    for spec in a.tree:
        name, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "benchmarks" / "race.py").is_file():
            ap.error(f"--tree {spec}: give NAME=DIR, where DIR holds benchmarks/race.py (a checkout of the project)")
        trees.append((name, Path(path).resolve()))
    results = []
    for k in range(a.rounds):
        for name, tree in trees if k % 2 == 0 else trees[::-1]:
            r = run_tree(name, tree, k, a.race_args)
            results.append(r)
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"round {k + 1} {name}: " + ", ".join(f"{c} {r.get(c)}" for c in COLUMNS), flush=True)
    print(table(results, [n for n, _ in trees]))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
