"""The event stream: everything the trainer wants anyone to know, as typed events.

Rank 0 appends them as JSON lines to run_dir/events.jsonl (one write per line, each whole); the rich renderer, user
callbacks and the console consume the same objects. docs/events.md documents every field; a test keeps
that page and these classes in step."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from libreyolo.errors import DiskFullError, disk_full_in
from libreyolo.tasks import DETECT

SCHEMA_VERSION = 5
# what readers (the console) still accept: version 1 files lack run_start's loss_terms and cuda_graph_mode/
# cuda_graph_reason and val's eval_s; versions 1 and 2 lack run_start's metrics and val's metrics (they are
# detection runs: precision, recall, map50, map); versions 1-3 lack val's held_s (their time_s is the time
# validation held the loop); versions 1-4 lack val's per_class; a reader derives or omits them
READABLE_VERSIONS = (1, 2, 3, 4, 5)


@dataclass
class Event:
    type: ClassVar[str] = "event"
    t: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        d = {"type": self.type, "v": SCHEMA_VERSION}
        d.update(dataclasses.asdict(self))
        return d


@dataclass
class RunStart(Event):
    type: ClassVar[str] = "run_start"
    run_dir: str
    model: str
    family: str
    task: str
    nc: int
    names: list[str]
    data: str
    epochs: int
    start_epoch: int
    batch: int
    batch_per_rank: int
    accumulate: int
    world_size: int
    imgsz: int
    device: str
    amp: bool
    amp_dtype: str
    cuda_graph: str  # the cuda_graph key as given: auto | true | full | false
    cuda_graph_mode: str  # what the run uses: full | true | false
    cuda_graph_reason: str  # one line: why that mode
    loss_terms: list[str]  # the family's loss terms, in order: the keys of every losses dict below
    workers: int
    optimizer: str
    steps_per_epoch: int
    train_images: int
    val_images: int
    params: int
    pid: int
    resumed: bool
    config: dict[str, Any]
    # the task's validation metrics, in order (libreyolo.tasks): the keys of every val.metrics dict
    metrics: list[str] = field(default_factory=lambda: list(DETECT.metric_names))


@dataclass
class EpochStart(Event):
    type: ClassVar[str] = "epoch_start"
    epoch: int
    epochs: int
    steps: int
    mosaic: bool


@dataclass
class Step(Event):
    """Emitted every log_interval seconds, not every step; losses are means since the epoch started, read
    back from the GPU without waiting: empty ({}) until the epoch's first read-back has landed."""

    type: ClassVar[str] = "step"
    epoch: int
    step: int
    steps: int
    losses: dict[str, float]
    lr: float
    img_s: float
    data_frac: float
    step_ms: float
    gpu_mem_gb: float
    eta_s: float


@dataclass
class Val(Event):
    """`metrics` holds the task's metrics by name (run_start.metrics). A detection run also fills the four
    fields it had before version 3 (precision, recall, map50, map), None for other tasks; either way of
    building one fills the other."""

    type: ClassVar[str] = "val"
    epoch: int
    losses: dict[str, float]
    images: int
    time_s: float  # forward, loss and NMS, wherever they ran (on a GPU: a thread beside the next epoch's steps)
    eval_s: float  # the COCO evaluation (on a background thread while the next epoch trains)
    metrics: dict[str, float] = field(default_factory=dict)
    held_s: float | None = None  # how long starting the validation held the training loop (None before v4)
    # detection: a row per class in the dataset's names order (eval/perclass.py: class, images, instances,
    # precision, recall, map50, map); None for other tasks and before v5
    per_class: list[dict[str, Any]] | None = None
    precision: float | None = None
    recall: float | None = None
    map50: float | None = None
    map: float | None = None

    def __post_init__(self) -> None:
        four = ("precision", "recall", "map50", "map")
        if not self.metrics and self.map is not None:
            self.metrics = {k: float(getattr(self, k)) for k in four}
        elif all(k in self.metrics for k in four):
            for k in four:
                setattr(self, k, float(self.metrics[k]))


@dataclass
class EpochEnd(Event):
    type: ClassVar[str] = "epoch_end"
    epoch: int
    losses: dict[str, float]
    lr: dict[str, float]
    time_s: float
    img_s: float
    fitness: float | None
    best_fitness: float | None
    skipped_images: int


@dataclass
class Checkpoint(Event):
    type: ClassVar[str] = "checkpoint"
    path: str
    kind: str  # last | best | period | interrupt
    epoch: int
    step: int


@dataclass
class Amp(Event):
    type: ClassVar[str] = "amp"
    enabled: bool
    dtype: str
    scaler: bool
    scale: float | None
    skipped_steps: int
    epoch: int | None
    reason: str


@dataclass
class Graph(Event):
    type: ClassVar[str] = "graph"
    action: str  # capture | fallback | invalidate | eager_shape | recapture
    mode: str  # network | full | off
    reason: str
    shape: list[int] | None = None
    allocated_before_mb: float | None = None
    allocated_after_mb: float | None = None
    reserved_before_mb: float | None = None
    reserved_after_mb: float | None = None
    delta_allocated_mb: float | None = None
    delta_reserved_mb: float | None = None


@dataclass
class Profile(Event):
    type: ClassVar[str] = "profile"
    verdict: str
    why: str
    levers: list[str]
    step_ms: float
    img_s: float
    utilization: float | None
    phases: dict[str, float]
    artifacts: dict[str, str]


@dataclass
class Vram(Event):
    type: ClassVar[str] = "vram"
    epoch: int
    peak_allocated_mb: float
    peak_reserved_mb: float
    device: str


@dataclass
class WarningEvent(Event):
    type: ClassVar[str] = "warning"
    message: str
    code: str = ""


@dataclass
class ErrorEvent(Event):
    type: ClassVar[str] = "error"
    message: str
    traceback: str = ""


@dataclass
class RunEnd(Event):
    type: ClassVar[str] = "run_end"
    status: str  # finished | interrupted | failed | early_stop | profiled
    epochs_done: int
    best_fitness: float | None
    best: str | None
    last: str | None
    time_s: float
    metrics: dict[str, float]


@dataclass
class Heartbeat(Event):
    type: ClassVar[str] = "heartbeat"
    epoch: int
    step: int
    pid: int


EVENT_TYPES: dict[str, type[Event]] = {
    c.type: c
    for c in (
        RunStart,
        EpochStart,
        Step,
        Val,
        EpochEnd,
        Checkpoint,
        Amp,
        Graph,
        Profile,
        Vram,
        WarningEvent,
        ErrorEvent,
        RunEnd,
        Heartbeat,
    )
}


class EventWriter:
    """Appends events as JSON lines, each in one unbuffered write, so a reader (the console) sees it at once and
    every line in the file is whole: a write that fails (a full disk) is cut back to the last newline, and a file a
    killed process left with half a line is cut back the same way when opened again. A full disk raises
    DiskFullError naming the file, once; the events after it are written if space comes back, else dropped (the run
    is ending with that error)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._failed = False
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            os.ftruncate(self._fd, _last_newline(self._fd, size))

    def write(self, event: Event) -> None:
        if self._fd < 0:
            return
        data = (json.dumps(event.to_dict(), default=_json_default) + "\n").encode()
        end = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[self._os_write(self._fd, view) :]
        except OSError as e:
            os.ftruncate(self._fd, end)
            if self._failed:
                return
            self._failed = True
            if disk_full_in(e):
                raise DiskFullError.at(self.path) from e
            raise

    _os_write = staticmethod(os.write)  # the one write call (tests put a failing one here)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _last_newline(fd: int, size: int) -> int:
    """The length of the file up to and with its last newline (0 if it has none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        chunk = os.pread(fd, pos - start, start)
        k = chunk.rfind(b"\n")
        if k >= 0:
            return start + k + 1
        pos = start
    return 0


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def read_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every complete line of an events file as a dict (a partial last line is left for later)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                yield json.loads(line)


def validate_event(d: dict[str, Any]) -> None:
    """Raise ValueError if d does not match the documented schema of its type."""
    cls = EVENT_TYPES.get(d.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown event type {d.get('type')!r}")
    if d.get("v") != SCHEMA_VERSION:
        raise ValueError(f"{cls.type}: schema version {d.get('v')!r}, expected {SCHEMA_VERSION}")
    expected = {f.name for f in dataclasses.fields(cls)} | {"type", "v"}
    missing, extra = expected - d.keys(), d.keys() - expected
    if missing or extra:
        raise ValueError(f"{cls.type}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for f in dataclasses.fields(cls):
        if not _type_ok(d[f.name], str(f.type)):
            raise ValueError(f"{cls.type}.{f.name}={d[f.name]!r} does not match {f.type}")


def _type_ok(value: Any, annotation: str) -> bool:
    checks: dict[str, Callable[[Any], bool]] = {
        "int": lambda x: isinstance(x, int) and not isinstance(x, bool),
        "float": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
        "str": lambda x: isinstance(x, str),
        "bool": lambda x: isinstance(x, bool),
        "None": lambda x: x is None,
    }
    for alt in annotation.split("|"):
        alt = alt.strip()
        base = alt.split("[")[0]
        if base in checks and checks[base](value):
            return True
        if base == "list" and isinstance(value, list):
            return True
        if base == "dict" and isinstance(value, dict):
            return True
    return False


Callback = Callable[[Event], None]
