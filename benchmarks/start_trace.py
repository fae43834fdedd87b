"""Where a `libreyolo train` process's start goes, from launch to its first training step.

    T_LAUNCH=$(date +%s.%N) python benchmarks/start_trace.py OUT.json data=/tmp/s800/data.yaml epochs=1 batch=16
    python benchmarks/start_trace.py --report OUT.json [MIN_SPAN_S]

Runs the command as `libreyolo train` does (the CUDA driver's start begun before torch is imported), and records:
- marks: the wall time of the imports and of the setup's and the warm-up's calls (epoch_trace.timer's wrappers),
  per thread, from T_LAUNCH (the
  shell's clock just before it started Python; the process's own start if unset);
- every 2 ms, each Python thread's innermost frame and innermost libreyolo frame. A gap in the samples means a
  thread held the interpreter lock (a C call that does not let go of it: importing a library, a CUDA call).
--report prints the marks up to the first step event and each thread's timeline in spans of one frame."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

T0 = float(os.environ.get("T_LAUNCH", time.time()))


class Sampler:
    def __init__(self) -> None:
        self.samples: list[tuple[float, str, str, str | None, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="sampler")
        self._thread.start()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(0.002):
            names = {t.ident: t.name for t in threading.enumerate()}
            now = time.time() - T0
            for tid, f in sys._current_frames().items():
                if tid == me:
                    continue
                inner = f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}"
                ours, importing = None, None
                g: Any = f
                while g is not None:
                    fn = g.f_code.co_filename
                    if ours is None and "/libreyolo/" in fn:
                        ours = f"{fn.split('/libreyolo/')[-1]}:{g.f_code.co_name}"
                    if "importlib._bootstrap" in fn and g.f_code.co_name == "_find_and_load":
                        importing = g.f_locals.get("name", importing)  # the outermost import in progress
                    g = g.f_back
                self.samples.append((round(now, 4), names.get(tid, str(tid))[:24], inner, ours, importing))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def trace(out: str, args: list[str]) -> None:
    marks: list[tuple[str, float, float, str]] = [("python started", time.time(), 0.0, "MainThread")]
    from libreyolo.cli import cudastart

    cudastart.start(["train", *args])
    sampler = Sampler()
    t = time.time()
    import torch

    marks.append(("import torch", t, time.time() - t, "MainThread"))
    t = time.time()
    import libreyolo.cli.main as cli_main
    import libreyolo.cli.train  # noqa: F401
    import libreyolo.engine.trainer  # noqa: F401

    marks.append(("import libreyolo's command and trainer", t, time.time() - t, "MainThread"))
    from epoch_trace import timer  # this folder is on sys.path when run as a script; it imports torch itself

    from libreyolo import model
    from libreyolo.distributed import context
    from libreyolo.engine import lossscale, passes, setup, trainer, warmup

    timed: list[tuple[str, float, float, str]] = []  # perf_counter starts, turned into wall times below
    wrap = timer(timed)
    for owner, name in [
        (model.LibreYOLO, "__init__"),
        (context, "start"),
        (torch.cuda, "set_device"),
        (setup, "load_data_config"),
        (setup, "scan_split"),
        (model.LibreYOLO, "prepare_for_training"),
        (passes, "open_pass"),
        (passes.Peekable, "peek"),
        (setup, "build_step_parts"),
        (warmup.KernelWarmup, "start"),
        (warmup.KernelWarmup, "_forward"),
        (warmup.KernelWarmup, "_backward"),
        (warmup.KernelWarmup, "join"),
        (lossscale.ScaleSearch, "search"),
        (setup, "select_step"),
        (trainer.Trainer, "save"),
        (trainer.Trainer, "_start_loss_scale"),
    ]:
        wrap(owner, name)
    emit = trainer.Trainer.emit

    def emitted(self: Any, e: Any) -> None:
        marks.append((f"event {e.type}", time.time(), 0.0, threading.current_thread().name))
        emit(self, e)

    trainer.Trainer.emit = emitted  # type: ignore[method-assign]
    rc = cli_main.main(["train", *args])
    sampler.stop()
    to_wall = time.time() - time.perf_counter()
    marks += [(label, a + to_wall, d, n) for label, a, d, n in timed]
    rows = [(label, round(a - T0, 4), round(d, 4), n) for label, a, d, n in marks]
    with open(out, "w") as fh:
        json.dump({"rc": rc, "marks": rows, "samples": sampler.samples}, fh)


def report(path: str, min_span: float = 0.04) -> None:
    with open(path) as fh:
        d = json.load(fh)
    marks = sorted(d["marks"], key=lambda m: m[1])
    first = next((m[1] for m in marks if m[0] == "event step"), float("inf"))
    print(f"first step event {first:.3f} s after launch")
    for label, a, dur, thread in marks:
        if a <= first + 0.01:
            print(f"  {a:7.3f} +{dur * 1000:7.1f} ms  {thread[:18]:18s} {label}")
    for thread in sorted({s[1] for s in d["samples"]}):
        spans: list[list[Any]] = []
        prev = None
        for t, name, inner, ours, importing in d["samples"]:
            if name != thread or t > first:
                continue
            key = f"import {importing}" if importing else (ours or inner)
            if prev is not None and t - prev > 0.02:
                spans.append([prev, t, "(no sample: the interpreter lock was held)"])
            if spans and spans[-1][2] == key and prev is not None and t - prev <= 0.02:
                spans[-1][1] = t
            else:
                spans.append([t, t, key])
            prev = t
        shown = [s for s in spans if s[1] - s[0] >= min_span]
        if shown:
            print(f"--- {thread}")
            for a, b, key in shown:
                print(f"  {a:7.3f}-{b:7.3f} {1000 * (b - a):7.1f} ms  {key}")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the report quietly
        report(sys.argv[2], *(float(x) for x in sys.argv[3:4]))
    else:
        trace(sys.argv[1], sys.argv[2:])
        os._exit(0)  # as the command does: no interpreter teardown
