"""Run folders: runs/train/exp, exp2, ...; args.yaml; results.csv with the Ultralytics column names (the metric
columns are the task's: libreyolo/tasks/)."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any

import yaml

from libreyolo.tasks import DETECT, Task

METRIC_COLUMNS = list(DETECT.columns)  # detection's, for readers of detection runs' results.csv


def results_columns(loss_terms: list[str] | tuple[str, ...], param_groups: int, task: Task = DETECT) -> list[str]:
    """The Ultralytics layout, built from the family's loss terms, its task's metrics and the optimizer's parameter
    groups."""
    return [
        "epoch",
        "time",
        *(f"train/{t}_loss" for t in loss_terms),
        *task.columns,
        *(f"val/{t}_loss" for t in loss_terms),
    ] + [f"lr/pg{j}" for j in range(param_groups)]


def results_row(
    epoch: int,
    time_s: float,
    train_losses: dict[str, float],
    metrics: dict[str, float],
    val_losses: dict[str, float],
    lrs: list[float],
    task: Task = DETECT,
) -> dict[str, float]:
    """One results.csv row; metrics holds the task's metrics by name."""
    row = {
        "epoch": epoch,
        "time": round(time_s, 1),
        **{f"train/{t}_loss": v for t, v in train_losses.items()},
        **{f"val/{t}_loss": v for t, v in val_losses.items()},
        **{f"lr/pg{j}": lr for j, lr in enumerate(lrs)},
    }
    row.update((m.column, metrics[m.name]) for m in task.metrics)
    return row


def increment_run_dir(project: str | os.PathLike[str], name: str, exist_ok: bool) -> Path:
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


def append_results(path: Path, row: dict[str, float], columns: list[str]) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(columns)
        w.writerow([_fmt(row.get(c, "")) for c in columns])


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v
