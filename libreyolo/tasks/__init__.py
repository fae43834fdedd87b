"""Tasks: what a kind of model does and is judged by (detect, classify; segment and pose would be more). Torch-free:
the event stream, the renderer and the console read it.

A task is a folder: its `__init__.py` registers a Task (this module's description: its validation metrics, with
display labels and results.csv columns, its fitness, the weighted sum that picks best.pt and drives early stopping,
its headline metric) whose `impl` names the module holding its implementation (tasks/base.py's TaskImpl: how its
datasets are read, its training and validation views, its validation, its predict output), imported on first use. A
family declares its task (`Family.task`). Tasks are discovered: every sub-package of this folder at import, and the
entry points of the group `libreyolo.tasks` (a plug-in's) when a name is not found or all are listed."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libreyolo.tasks.base import TaskImpl

ENTRY_POINTS = "libreyolo.tasks"


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
    impl: Any = None  # "package.module" (its IMPL) or the TaskImpl itself; None: a description only
    mosaic: bool = False  # its training pipeline has mosaic epochs (the renderer tells them from the others)

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

    def implementation(self) -> TaskImpl:
        got = _IMPLS.get(self.name)
        if got is None:
            if self.impl is None:
                raise NotImplementedError(f"task {self.name!r} has no implementation")
            if isinstance(self.impl, str):
                module, _, attr = self.impl.partition(":")
                got = getattr(importlib.import_module(module), attr or "IMPL")
            else:
                got = self.impl
            _IMPLS[self.name] = got
        return got


TASKS: dict[str, Task] = {}  # name -> Task: the built-in ones from import on, a plug-in's once looked up
_IMPLS: dict[str, Any] = {}


def register(task: Task) -> Task:
    if task.name in TASKS and TASKS[task.name] is not task:
        raise ValueError(f"a task named {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


def unregister(name: str) -> None:
    TASKS.pop(name, None)
    _IMPLS.pop(name, None)


def tasks() -> dict[str, Task]:
    """Every task, the plug-ins' too."""
    _load_plugins()
    return dict(TASKS)


def get_task(name: str) -> Task:
    if name not in TASKS:
        _load_plugins()
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def task_of_metrics(names: list[str] | tuple[str, ...]) -> Task | None:
    """The task whose metric names these are (a reader with only an event file's run_start.metrics)."""
    return next((t for t in TASKS.values() if t.metric_names == tuple(names)), None)


_plugins_loaded = False


def _load_plugins() -> None:
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINTS):
            ep.load()


for _m in pkgutil.iter_modules(__path__):
    if _m.ispkg:
        importlib.import_module(f"{__name__}.{_m.name}")

# detection is what a run whose events predate tasks (schema versions 1 and 2) was
DETECT = TASKS["detect"]
