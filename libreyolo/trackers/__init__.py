"""Experiment trackers: `mlflow=true` (MLflow), `wandb=true` (Weights & Biases). Each is a sink of the run's event
stream, as TensorBoard is, attached by `model.train` before the first step (`attach`, the trainer's on_start);
base.py says what they log and how a failing backend is kept away from the run. docs/trackers.md is the user's
page. Each is an optional extra: `require` says how to install a missing one before a run starts."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from rich.console import Console

from libreyolo import events as ev
from libreyolo.errors import ConfigError
from libreyolo.trackers.base import Backend, Tracker

if TYPE_CHECKING:
    from libreyolo.config import TrainConfig
    from libreyolo.engine.loop import RunLoop

# key -> (module, the install line)
PACKAGES = {
    "mlflow": ("mlflow", 'mlflow=true needs MLflow: pip install "libreyolo[mlflow]" (or pip install mlflow-skinny)'),
    "wandb": ("wandb", 'wandb=true needs the wandb package: pip install "libreyolo[wandb]" (or pip install wandb)'),
}


def requested(cfg: TrainConfig) -> list[str]:
    return [k for k in PACKAGES if getattr(cfg, k, False)]


def require(cfg: TrainConfig) -> None:
    """Raise ConfigError saying how to install it for each tracker the run asks for whose package is missing."""
    for key in requested(cfg):
        module, install = PACKAGES[key]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(install)


def backend(key: str) -> Backend:
    if key == "mlflow":
        from libreyolo.trackers.mlflow_backend import MLflowBackend

        return MLflowBackend()
    from libreyolo.trackers.wandb_backend import WandbBackend

    return WandbBackend()


def attach(trainer: RunLoop) -> list[Tracker]:
    """On a set-up trainer (rank 0 only): a Tracker per requested key, added to the run's sinks, and its close
    after the run's other closers (plots written in a closer are there to upload)."""
    cfg, s = trainer.cfg, trainer.s
    if not s.is_main or not requested(cfg):
        return []
    require(cfg)  # a resumed run reads the keys from its checkpoint: checked again here
    ended = {"run_end": False}

    def warn(message: str) -> None:
        # while the run emits events, a warning event (events.jsonl, the renderer, the console); after run_end the
        # event file is closed: stderr
        if ended["run_end"]:
            Console(stderr=True, highlight=False, soft_wrap=True).print(f"[yellow]warning[/] {message}", markup=True)
        else:
            trainer.emit(ev.WarningEvent(message, code="tracker"))

    def watch_end(e: ev.Event) -> None:
        if e.type == "run_end":
            ended["run_end"] = True

    config, task = cfg.to_dict(), s.family.task
    made = [(backend(k), s.run_dir, str(cfg.project), config, task, warn, s.resumed) for k in requested(cfg)]
    trackers = [Tracker(*args) for args in made]
    s.sinks.extend([watch_end, *trackers])
    s.closers.extend(t.close for t in trackers)
    return trackers
