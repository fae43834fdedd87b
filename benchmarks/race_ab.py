"""Races of two or more code trees, alternating on one machine: `libreyolo bench race` run from each tree.

    git archive OLD_COMMIT | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python benchmarks/race_ab.py --tree new=. --tree old=/tmp/old --rounds 3 --out /tmp/ab.jsonl -- \\
        data=/tmp/s800/data.yaml epochs=15 imgsz=640 batch=16

Each round runs every tree once, in the order given, then in reverse in the next round (so that neither always runs
first on a machine that warms up). A tree runs as its own code: `python -m libreyolo.cli.main bench race ...
json=true` with the tree's directory first on PYTHONPATH and as the working directory, so the race and the
`libreyolo train` process it starts are the tree's. A tree needs `bench race` (libreyolo/bench/race.py). The keys
after `--` go to `bench race` (`modes=`, and every training key); race_ab sets `project=` (one folder per tree and
round under --project) and `json=true` itself. Every run's JSON line, with its tree, goes to --out as it lands; the
table gives each part's values per tree (and per mode, when several) and their mean. Machines differ by more than
most changes do: compare trees within one call, never across calls."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

COLUMNS = ("wall_s", "start_s", "train_s", "seams_s", "end_s", "gpu_util_mean", "map50_95")
OWN_KEYS = ("project", "json", "rounds")  # set here (rounds: --rounds alternates the trees instead)


def race_command(project: Path, race_args: list[str]) -> list[str]:
    """The `bench race` command a tree runs, from its own directory."""
    return [sys.executable, "-m", "libreyolo.cli.main", "bench", "race", *race_args, f"project={project}", "json=true"]


def run_tree(name: str, tree: Path, project: Path, race_args: list[str]) -> list[dict]:
    """One `bench race` call from this tree -> its runs' JSON objects (one per mode), each with `tree` added."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    proc = subprocess.run(race_command(project, race_args), cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not runs:
        return [{"tree": name, "rc": proc.returncode or 1, "error": proc.stdout[-2000:]}]
    return [{"tree": name, **r} for r in runs]


def label(r: dict, several_modes: bool) -> str:
    return f"{r['tree']} {r['mode_asked']}" if several_modes and "mode_asked" in r else r["tree"]


def table(results: list[dict]) -> str:
    """A markdown table: one row per tree (per tree and mode when the runs asked for several modes)."""
    several = len({r["mode_asked"] for r in results if "mode_asked" in r}) > 1
    rows = [f"| tree | {' | '.join(COLUMNS)} |", "|" + " --- |" * (len(COLUMNS) + 1)]
    for name in dict.fromkeys(label(r, several) for r in results):
        mine = [r for r in results if label(r, several) == name]
        ok = [r for r in mine if r.get("rc") == 0]
        cells = []
        for col in COLUMNS:
            values = [r[col] for r in ok if r.get(col) is not None]
            cells.append(
                ", ".join(f"{v:g}" for v in values) + (f" (mean {statistics.mean(values):.4g})" if values else "")
            )
        failed = len(mine) - len(ok)
        rows.append(f"| {name}{f' ({failed} failed)' if failed else ''} | {' | '.join(cells)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, a checkout or `git archive` of a commit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True, help="every run's JSON line, appended as it lands")
    ap.add_argument("--project", type=Path, default=Path("/tmp/race-ab"), help="the runs' folders go under it")
    ap.add_argument("race_args", nargs="+", help="after --: bench race's keys (data=... epochs=... modes=...)")
    a = ap.parse_args(argv)
    if own := [x for x in a.race_args if x.split("=", 1)[0] in OWN_KEYS]:
        ap.error(f"{own[0]}: race_ab sets project= and json=, and alternates the trees over --rounds")
    trees = []
    for spec in a.tree:
        name, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "libreyolo" / "bench" / "race.py").is_file():
            ap.error(f"--tree {spec}: give NAME=DIR, where DIR is a tree of the project with libreyolo/bench/race.py")
        trees.append((name, Path(path).resolve()))
    results = []
    for k in range(a.rounds):
        for name, tree in trees if k % 2 == 0 else trees[::-1]:
            for r in run_tree(name, tree, a.project.resolve() / f"{name}{k}", a.race_args):
                results.append(r)
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"round {k + 1} {name}: " + ", ".join(f"{c} {r.get(c)}" for c in COLUMNS), flush=True)
    print(table(results))
    return 0 if all(r.get("rc") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
