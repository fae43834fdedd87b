"""Run folders: runs/train/exp, exp2, ...; args.yaml; results.csv with the Ultralytics column names."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any

import yaml

RESULTS_COLUMNS = [
    "epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss",
    "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)",
    "val/box_loss", "val/cls_loss", "val/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2",
]


def increment_run_dir(project: str | os.PathLike, name: str, exist_ok: bool) -> Path:
    """project/name if free (or exist_ok), else the first free project/name2, name3, ... (created atomically)."""
    project = Path(project)
    project.mkdir(parents=True, exist_ok=True)
    path = project / name
    if exist_ok:
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = re.sub(r"\d+$", "", name) if (project / name).exists() else name
    n = 1
    while True:
        candidate = project / (name if n == 1 else f"{base}{n}")
        try:
            candidate.mkdir(parents=False)  # atomic: two runs started together never share a folder
            return candidate
        except FileExistsError:
            n += 1


def write_args(run_dir: Path, args: dict[str, Any]) -> None:
    clean = {k: (v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v)) for k, v in args.items()}
    (run_dir / "args.yaml").write_text(yaml.safe_dump(clean, sort_keys=False))


def append_results(path: Path, row: dict[str, float]) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(RESULTS_COLUMNS)
        w.writerow([_fmt(row.get(c, "")) for c in RESULTS_COLUMNS])


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v
