"""The per-class rows the console shows, without Textual: the best epoch's table of one run (the Metrics panel) and
the difference of two runs' tables (the compare view).

The rows are the trainer's (val.per_class, event schema 5: eval/perclass.py's table, read off faster-coco-eval's
arrays); nothing here computes a metric. The trainer writes them for each validation that beat every earlier one of
its process and for the final epoch, so the best epoch, the one best.pt holds, always has them (a file written
before schema 5 has none, and the panels say so)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo_console.state import EpochRow, RunState
from libreyolo_console.widgets.fmt import num

COLUMNS = ("class", "images", "instances", "P", "R", "mAP50", "mAP50-95")
DIFF_COLUMNS = ("class", "A mAP50-95", "B mAP50-95", "B - A")
_METRICS = ("precision", "recall", "map50", "map")

Cells = tuple[str, ...]


def best_rows(state: RunState) -> tuple[EpochRow | None, list[dict[str, Any]] | None]:
    """The best epoch (best fitness: best.pt's) and its per-class rows (None where the trainer wrote none)."""
    best = state.best
    return best, (best.per_class if best is not None else None)


def _count(v: Any) -> str:
    return str(v) if isinstance(v, int) else "-"


def _metric(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def table_cells(best: EpochRow, rows: list[dict[str, Any]]) -> list[Cells]:
    """The row of all classes (the epoch's own P, R, mAP50, mAP50-95) and one per class, in the dataset's order, as
    `libreyolo val` prints them (a class without ground truth shows - for its metrics)."""
    instances = sum(r["instances"] for r in rows if isinstance(r.get("instances"), int))
    out = [("all", _count(best.images), str(instances), *(num(best.metrics.get(k), 4) for k in _METRICS))]
    for r in rows:
        out.append(
            (
                str(r.get("class", "?")),
                _count(r.get("images")),
                _count(r.get("instances")),
                *(num(_metric(r, k), 4) for k in _METRICS),
            )
        )
    return out


def heading(state: RunState) -> str:
    """One line over the per-class table: which epoch it is, or why there is none."""
    best, rows = best_rows(state)
    if state.task.name != "detect":
        return f"no per-class table: a {state.task.name} run's metrics are not per class"
    if best is None:
        return "per class: shown for the best epoch once a validation has landed"
    if rows is None:
        return (
            f"no per-class rows for epoch {best.epoch + 1}, the best: written by libreyolo's trainer from event "
            "schema 5 on (`libreyolo val model=.../best.pt` prints them)"
        )
    return f"per class, epoch {best.epoch + 1} (the best: best.pt)"


@dataclass(frozen=True)
class DiffRow:
    name: str
    a: float | None  # mAP50-95 of the class in run A (None: A has no such class, or it had no ground truth)
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    def cells(self) -> Cells:
        d = self.delta
        return (self.name, num(self.a), num(self.b), "-" if d is None else f"{d:+.3f}")


def diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[DiffRow]:
    """Per class, by name: mAP50-95 of A, of B, and B - A; A's classes in A's order, then those only B has."""
    of_a = {str(r.get("class")): _metric(r, "map") for r in a}
    of_b = {str(r.get("class")): _metric(r, "map") for r in b}
    names = list(of_a) + [n for n in of_b if n not in of_a]
    return [DiffRow(n, of_a.get(n), of_b.get(n)) for n in names]


def diff_note(a_name: str, a: RunState, b_name: str, b: RunState) -> str:
    """What the per-class difference compares, or why it cannot."""
    missing = [n for n, s in ((a_name, a), (b_name, b)) if best_rows(s)[1] is None]
    if missing:
        return f"per class: no per-class rows for the best epoch of {', '.join(missing)} (event schema 5 writes them)"
    ea, eb = a.best, b.best
    assert ea is not None and eb is not None
    return (
        f"per class mAP50-95: A = {a_name} (epoch {ea.epoch + 1}), B = {b_name} (epoch {eb.epoch + 1}), "
        "each run's best epoch"
    )
