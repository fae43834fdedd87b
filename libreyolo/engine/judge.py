"""The run's best epoch and early stopping, judged by the loop alone from each validation that lands."""

from __future__ import annotations

import math


class BestEpoch:
    """The best fitness so far, its metrics, and the patience left: `patience` validations in a row without a
    better fitness stop the run (0: never). A resumed run starts from its checkpoint's best (engine/checkpoint.py's
    best_so_far) with its patience full."""

    def __init__(self, patience: int, fitness: float | None = None, metrics: dict[str, float] | None = None):
        self.patience = patience
        self.fitness, self.metrics = fitness, dict(metrics or {})
        self.left = patience or math.inf

    def judge(self, fitness: float, metrics: dict[str, float]) -> tuple[bool, bool]:
        """One landed validation. -> (these weights are the best so far, patience has run out)."""
        improved = self.fitness is None or fitness > self.fitness
        if improved:
            self.fitness, self.metrics = fitness, dict(metrics)
            self.left = self.patience or math.inf
        else:
            self.left -= 1
        return improved, self.left <= 0
