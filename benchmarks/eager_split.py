"""Where the eager step's wall time goes, per thread: the loop's host time in each phase, the overlapped backward's
duration, how long the loop waits for it, and each OS thread's CPU time (autograd's device thread included).

    python benchmarks/eager_split.py [--steps 64] [--no-overlap] -- model=LibreYOLO9t batch=8 imgsz=640

Runs `bench step`'s eager runner on its batch: warm-up steps, then `--steps` micro-steps back to back (an optimizer
step every accumulation window), timed with perf_counter around the step's own methods (one clock read per call,
no synchronisation inside the window). Each OS thread's CPU time comes from /proc/self/task (clock ticks, so only
the window's sum is read). Prints one JSON line, ms per micro-step:
- wall: the window's wall time (a synchronisation at its end) over its steps;
- loop: forward, loss, scale (GradScaler.scale), wait (for the previous overlapped backward), backward (without the
  overlap, or a boundary's), optimizer, ema, other (the rest of the step's time on the loop's thread);
- backward: the overlapped backward's wall time on its helper thread (autograd runs it on its device thread);
- cpu_ms: CPU time per step of each thread, by name (the loop is `python`/`python3`; autograd's is `pt_autograd_0`).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class EagerBench:
    """`bench step`'s eager runner on its replayed batch (the other eager benchmarks here build on it)."""

    cfg: Any
    device: torch.device
    data: dict[str, torch.Tensor]
    nc: int
    step: Any
    parts: Any
    done: int = 0  # micro-steps run so far

    @classmethod
    def build(cls, overrides: list[str], **defaults: str) -> EagerBench:
        from libreyolo.bench.step import DEFAULTS, _batch_on_device, bench_device, make_runner
        from libreyolo.config import TrainConfig

        cfg = TrainConfig.from_overrides({**DEFAULTS, **defaults, **dict(o.split("=", 1) for o in overrides)})
        device, _ = bench_device(cfg)
        data, nc = _batch_on_device(cfg, cfg.batch, device)
        step, parts = make_runner(cfg, device, nc, "eager")
        return cls(cfg, device, data, nc, step, parts)

    def run(self, k: int) -> None:
        """k micro-steps, an optimizer step at each accumulation boundary."""
        acc = self.parts.accumulate
        for _ in range(k):
            self.done += 1
            self.step(self.data["img"], self.data["targets"], self.data["mask"], self.done % acc == 0)

    def sync(self) -> None:
        """Until the last micro-step's work (an overlapped backward included) is done."""
        self.step.sync()
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def thread_files(file: str) -> Iterator[tuple[int, str, str]]:
    """(tid, thread name, text of /proc/self/task/TID/<file>) for every OS thread of this process still running."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/{file}") as f:
                text = f.read()
        except OSError:  # the thread ended
            continue
        yield int(tid), name, text


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every OS thread of this process, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    for _, name, stat in thread_files("stat"):
        fields = stat.rsplit(")", 1)[1].split()
        out[name] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    from libreyolo.engine import overlap as overlap_module
    from libreyolo.engine import step as step_module

    spent: dict[str, float] = defaultdict(float)
    on = {"timing": False}
    main_thread = threading.main_thread()

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            if not on["timing"]:
                return fn(*args, **kw)
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                where = "loop" if threading.current_thread() is main_thread else "helper"
                spent[f"{where}.{name}"] += time.perf_counter() - t

        return wrapper

    E, P = step_module.EagerStep, overlap_module.PendingBackward
    E.forward = timed("forward", E.forward)  # type: ignore[method-assign]
    E._backward = timed("backward", E._backward)  # type: ignore[method-assign]
    E.optimizer_step = timed("optimizer", E.optimizer_step)  # type: ignore[method-assign]
    P.wait = timed("wait", P.wait)  # type: ignore[method-assign]
    E.__call__ = timed("step", E.__call__)  # type: ignore[method-assign]

    b = EagerBench.build(a.overrides)
    cfg, device, step, parts = b.cfg, b.device, b.step, b.parts
    assert isinstance(step, E), "eager_split times the eager runner"
    step.overlap_backward = not a.no_overlap and parts.accumulate > 1
    step.loss_fn = timed("loss", step.loss_fn)
    step.scaler.scale = timed("scale", step.scaler.scale)  # type: ignore[method-assign]
    if step.ema is not None:
        step.ema.update = timed("ema", step.ema.update)  # type: ignore[method-assign]
    cuda = device.type == "cuda"
    acc = parts.accumulate
    b.run(a.warmup)
    b.sync()
    cpu0 = thread_cpu()
    on["timing"] = True
    t0 = time.perf_counter()
    b.run(a.steps)
    on["timing"] = False  # the last backward's wait below is the window's (wall), not a step's phase
    b.sync()
    wall = time.perf_counter() - t0
    cpu1 = thread_cpu()
    per = 1000 / a.steps
    loop = {k.split(".", 1)[1]: v * per for k, v in spent.items() if k.startswith("loop.")}
    named = sum(v for k, v in loop.items() if k != "step")
    loop["other"] = loop.pop("step", 0.0) - named
    out = {
        "model": cfg.model,
        "batch": cfg.batch,
        "imgsz": cfg.imgsz,
        "accumulate": acc,
        "overlap": step.overlap_backward,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "wall_ms": wall * per,
        "loop_ms": {k: round(v, 2) for k, v in sorted(loop.items())},
        "helper_ms": {k.split(".", 1)[1]: round(v * per, 2) for k, v in spent.items() if k.startswith("helper.")},
        "cpu_ms": {k: round((cpu1.get(k, 0.0) - cpu0.get(k, 0.0)) * 1000 / a.steps, 1) for k in sorted(cpu1)},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()  # argparse takes the keys after `--` as the positional overrides
