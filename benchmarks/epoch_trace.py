"""Time the calls a training run makes around its steps: setup to the first step, between epochs, checkpoints.

    python benchmarks/epoch_trace.py data=/tmp/s800/data.yaml epochs=5 imgsz=640 batch=16 [key=value ...] [--out F]

Wraps the trainer's epoch-end, validation, checkpoint and loss-scale calls (and the loader's next and the step
runner's call, when they take 40 ms or more) with wall-clock timers, trains LibreYOLO9t (or model=...), and prints
one line per call: start time since the model was built (s), duration (ms), thread, call. The checkpoint writer's
save_atomic runs on its own thread: its lines show when the write overlapped the training thread. At each epoch's
end the GPU is synchronised once (gpu_drain: the queued steps finishing) before the trainer's own calls, which
would wait for them anyway."""

from __future__ import annotations

import argparse
import functools
import json
import threading
import time
from typing import Any

import torch

from libreyolo.engine import checkpoint, epochval, graphs, meters, trainer

SHORT = ("__call__", "__next__", "settle", "drain", "_step_event")  # reported only from 40 ms up


def timer(records: list[tuple[str, float, float, str]]) -> Any:
    """-> wrap(owner, name, label=None): replaces owner.name with a timed call recorded in records."""

    def wrap(owner: Any, name: str, label: str | None = None) -> None:
        fn = getattr(owner, name)
        label = label or f"{getattr(owner, '__name__', owner)}.{name}"

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                records.append((label, t, time.perf_counter() - t, threading.current_thread().name))

        setattr(owner, name, timed)

    return wrap


def instrument(records: list[tuple[str, float, float, str]]) -> None:
    wrap = timer(records)
    T, EV = trainer.Trainer, epochval.EpochValidations
    for owner, name in [
        (T, "_open_pass"), (T, "_end_epoch"), (T, "save"), (T, "_step_event"),
        (T, "_start_loss_scale"), (EV, "start"), (EV, "settle"), (EV, "prefetch"), (epochval, "start_validation"),
        (checkpoint, "save_atomic"), (trainer, "snapshot"), (meters.LossMeter, "final"),
        (checkpoint.CheckpointWriter, "drain"), (graphs.GraphRunner, "__call__"),
        (torch.utils.data.dataloader._MultiProcessingDataLoaderIter, "__next__"),
    ]:  # fmt: skip
        wrap(owner, name)

    end_epoch = T._end_epoch

    def drain_then_end(self: Any, epoch: int) -> Any:
        t = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        records.append(("gpu_drain", t, time.perf_counter() - t, "MainThread"))
        return end_epoch(self, epoch)

    T._end_epoch = drain_then_end  # type: ignore[method-assign]


def instrument_setup(records: list[tuple[str, float, float, str]]) -> None:
    """The setup's parts as build_setup calls them (the names it looks up in its own module)."""
    from libreyolo import model as model_mod
    from libreyolo.distributed import context
    from libreyolo.engine import components, lossscale, setup

    wrap = timer(records)
    wrap(trainer, "build_setup", "setup.build_setup")
    for name in ("load_data_config", "scan_split", "open_image_cache", "train_loader", "val_loader", "build_step_parts",
                 "select_step", "write_args", "cudnn_benchmark_for"):  # fmt: skip
        wrap(setup, name, f"setup.{name}")
    wrap(context, "start", "distributed.start")
    wrap(setup.autobatch, "resolve_global_batch", "autobatch.resolve_global_batch")
    wrap(setup.passes, "open_pass", "passes.open_pass")
    wrap(model_mod.LibreYOLO, "prepare_for_training", "LibreYOLO.prepare_for_training")
    wrap(components, "ModelEMA", "components.ModelEMA")
    wrap(components.optim, "build_optimizer", "optim.build_optimizer")
    wrap(components, "FlatParams", "components.FlatParams")
    wrap(epochval.EpochValidations, "__init__", "EpochValidations.__init__")
    wrap(lossscale, "probe_loss_scale", "lossscale.probe_loss_scale")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("keys", nargs="*", help="training keys, key=value")
    ap.add_argument("--out", help="also write the records as JSON")
    ap.add_argument("--setup", action="store_true", help="also time the setup's parts (from the model's build)")
    a = ap.parse_args()
    keys: dict[str, Any] = dict(k.split("=", 1) for k in a.keys)
    records: list[tuple[str, float, float, str]] = []
    instrument(records)
    if a.setup:
        instrument_setup(records)
    from libreyolo import LibreYOLO

    t0 = time.perf_counter()
    model = LibreYOLO(keys.pop("model", "LibreYOLO9t"))
    records.append(("LibreYOLO(...)", t0, time.perf_counter() - t0, "MainThread"))
    model.train(**{"project": "/tmp/epoch_trace", "exist_ok": "true", **keys})
    rows = sorted(((label, t - t0, d, thread) for label, t, d, thread in records), key=lambda r: r[1])
    for label, t, d, thread in rows:
        if label.endswith(SHORT) and d < 0.04:
            continue
        print(f"{t:8.3f} {d * 1000:8.1f} ms  {thread[:22]:22s} {label}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
