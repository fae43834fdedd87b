"""Tasks: what a kind of model is judged by. A family declares its task (`Family.task`); the task declares its
validation metrics (names, display labels, results.csv columns) and its fitness (the weighted sum that picks
best.pt and drives early stopping). The event stream, results.csv, the renderer, TensorBoard and the console
build from these, so none of them names a task's metrics. Bottom layer: imports nothing of libreyolo."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str  # the key in val events, metrics dicts and checkpoints
    label: str  # how the terminal and the console head its column
    column: str  # its results.csv (and TensorBoard) column


@dataclass(frozen=True)
class Task:
    name: str
    metrics: tuple[Metric, ...]
    fitness_weights: dict[str, float]  # metric name -> weight; fitness is the weighted sum
    headline: str  # the metric one number stands for (run lists, "best ..." lines)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(m.label for m in self.metrics)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(m.column for m in self.metrics)

    def fitness(self, metrics: dict[str, float]) -> float:
        return sum(w * float(metrics[k]) for k, w in self.fitness_weights.items())

    def label(self, name: str) -> str:
        return next((m.label for m in self.metrics if m.name == name), name)


DETECT = Task(
    "detect",
    (
        Metric("precision", "P", "metrics/precision(B)"),
        Metric("recall", "R", "metrics/recall(B)"),
        Metric("map50", "mAP50", "metrics/mAP50(B)"),
        Metric("map", "mAP50-95", "metrics/mAP50-95(B)"),
    ),
    {"map50": 0.1, "map": 0.9},  # Ultralytics' fitness
    "map",
)
# top-5 breaks ties between epochs of equal top-1 (small validation sets); the column names are Ultralytics'
CLASSIFY = Task(
    "classify",
    (Metric("top1", "top1", "metrics/accuracy_top1"), Metric("top5", "top5", "metrics/accuracy_top5")),
    {"top1": 0.9, "top5": 0.1},
    "top1",
)

TASKS: dict[str, Task] = {t.name: t for t in (DETECT, CLASSIFY)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def task_of_metrics(names: list[str] | tuple[str, ...]) -> Task | None:
    """The task whose metric names these are (a reader with only an event file's run_start.metrics)."""
    return next((t for t in TASKS.values() if t.metric_names == tuple(names)), None)
