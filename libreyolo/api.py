"""libreyolo's torch-free face: what works outside a training process needs, importable without torch (the console
imports nothing else; tests/test_layout.py checks both). The training keys and their parser, the model families'
names and keys, the tasks and their metrics, the event stream's schema and reader, the run folder's conventions, the
built-in dataset's settings, the version."""

from __future__ import annotations

from libreyolo import __version__
from libreyolo.config import TrainConfig, parse_kv, unknown_key_message
from libreyolo.data.config import is_builtin, load_data_config
from libreyolo.data.shapes import DEMO_SETTINGS
from libreyolo.errors import ConfigError, DataError, LibreYOLOError
from libreyolo.eta import EtaEstimator
from libreyolo.events import EVENT_TYPES, READABLE_VERSIONS, SCHEMA_VERSION, read_events, validate_event
from libreyolo.families import Family, families, get_family, model_names, parse_model_name
from libreyolo.render import fmt_duration
from libreyolo.runs import increment_run_dir, results_columns
from libreyolo.tasks import DETECT, TASKS, Task, get_task, task_of_metrics

__all__ = [
    "DEMO_SETTINGS",
    "DETECT",
    "EVENT_TYPES",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "TASKS",
    "ConfigError",
    "DataError",
    "EtaEstimator",
    "Family",
    "LibreYOLOError",
    "Task",
    "TrainConfig",
    "__version__",
    "families",
    "fmt_duration",
    "get_family",
    "get_task",
    "increment_run_dir",
    "is_builtin",
    "load_data_config",
    "model_names",
    "parse_kv",
    "parse_model_name",
    "read_events",
    "results_columns",
    "task_of_metrics",
    "unknown_key_message",
    "validate_event",
]
