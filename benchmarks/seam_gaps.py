"""Where the GPU waits: kernel gaps in profiled windows of a training run, with the host calls beside them.

    python benchmarks/seam_gaps.py data=/tmp/s800/data.yaml epochs=6 imgsz=640 batch=16 [key=value ...]
        [--seam-epoch 3] [--around 8] [--windows seam,mid,epoch] [--min-gap-ms 0.3] [--out F.json]

Trains LibreYOLO9t (or model=...) with the given keys and profiles (torch.profiler, CPU and CUDA activity) the
windows asked for: `seam`, `--around` steps either side of the end of epoch `--seam-epoch` (0-based: the seam
between it and the next); `mid`, as many steps in the middle of the epoch after; `epoch`, the whole epoch after
the seam, from its last step before the seam (the seam, the checkpoint's write and the validation beside it
included); `first`, the first epoch from its start. The trainer's, the checkpoint writer's and the validation's
calls are wrapped in record_function labels ("seam:..."), on whichever thread runs them. Prints, per window: its
span from the first kernel's start to the last kernel's end, the union of kernel intervals over that span (busy),
and every gap between kernels of at least --min-gap-ms, with the labelled host calls that overlapped it.
Profiling slows the host calls it records (each op a few microseconds): the gaps are an upper bound on what the
host costs the GPU without it.

With --sample-ms, a thread also samples every thread's Python stack that often while a window is open and prints,
for each gap of at least --explain-ms, the stacks each thread was seen in during it (the profiler records the labels
of the main thread only). A sample is late when the sampler waited for the interpreter lock: its lateness is
printed beside it. Garbage collections are logged throughout (gc.callbacks): their time by generation is printed,
and those that overlapped a gap are listed beside it."""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import os
import sys
import threading
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from libreyolo.engine import checkpoint, epochval, graphs, trainer
from libreyolo.eval import coco, threaded, validator

LABELLED = [
    (trainer.Trainer, "_end_epoch"), (trainer.Trainer, "save"), (trainer.Trainer, "_open_pass"),
    (trainer.Trainer, "_step_event"), (epochval.EpochValidations, "start"), (epochval.EpochValidations, "settle"),
    (epochval.EpochValidations, "prefetch"), (epochval.EpochValidations, "after_step"),
    (torch.utils.data.dataloader._MultiProcessingDataLoaderIter, "__next__"), (epochval.EpochValidations, "_warm_up"),
    (checkpoint, "save_atomic"), (validator.PendingValidation, "_evaluate"), (coco.CocoAccumulator, "add_batch"),
    (coco.CocoAccumulator, "evaluate"), (validator, "start_validation"), (threaded.ThreadedValidation, "_main"),
    (graphs.GraphRunner, "_try_capture"), (graphs.GraphRunner, "_eager_side"), (torch.cuda.graph, "__enter__"),
    (torch.cuda.graph, "__exit__"),
]  # fmt: skip


def label_calls() -> None:
    for owner, name in LABELLED:
        fn = getattr(owner, name)

        label = f"seam:{getattr(owner, '__name__', owner)}.{name}"

        def wrapped(*a: Any, __fn: Any = fn, __label: str = label, **k: Any) -> Any:
            with record_function(__label):
                return __fn(*a, **k)

        setattr(owner, name, functools.wraps(fn)(wrapped))


def analyse(prof: Any, min_gap_ms: float, sampled: list[Any] | None = None, explain_ms: float = 20.0) -> dict[str, Any]:
    kernels: list[tuple[int, int]] = []
    labels: list[tuple[int, int, str]] = []
    mark: int | None = None
    for e in prof.profiler.kineto_results.events():
        start, end = e.start_ns(), e.start_ns() + e.duration_ns()
        if e.device_type() == torch.autograd.DeviceType.CUDA:
            if "memcpy" in e.name().lower() or "memset" in e.name().lower():
                continue  # copies run on their own engines: a kernel gap with a copy in it is still a gap
            kernels.append((start, end))
        elif e.name() == "seam:mark":
            mark = start
        elif e.name().startswith("seam:"):
            labels.append((start, end, e.name()[5:]))
    kernels.sort()
    if not kernels:
        return {"kernels": 0}
    busy, gaps = 0, []
    cur_s, cur_e = kernels[0]
    t0 = cur_s
    for s, e in kernels[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            if (s - cur_e) / 1e6 >= min_gap_ms:
                over = sorted({name for ls, le, name in labels if ls < s and le > cur_e})
                gap = {"at_ms": round((cur_e - t0) / 1e6, 2), "ms": round((s - cur_e) / 1e6, 2), "host": over}
                if sampled and mark is not None and gap["ms"] >= explain_ms:
                    gap["threads"] = explain(sampled, cur_e - mark, s - mark)
                gaps.append(gap)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = cur_e - t0
    return {
        "kernels": len(kernels),
        "span_ms": round(span / 1e6, 2),
        "busy_ms": round(busy / 1e6, 2),
        "busy_frac": round(busy / span, 4),
        "gaps_ms_total": round(sum(g["ms"] for g in gaps), 2),
        "gap_ms_by_host_call": by_call(gaps),
        "gaps": gaps,
        "host_calls": [
            {"at_ms": round((s - t0) / 1e6, 2), "ms": round((e - s) / 1e6, 2), "call": n} for s, e, n in sorted(labels)
        ],
    }


CUDA = torch.cuda.is_available()


def short_stack(frame: Any, depth: int = 7) -> str:
    out = []
    while frame is not None and len(out) < depth:
        out.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(out)


class GcLog:
    """Every garbage collection: (start perf_counter ns, ms, generation, thread name)."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float, int, str]] = []
        self._t = 0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter_ns()
        else:
            ms = (time.perf_counter_ns() - self._t) / 1e6
            self.runs.append((self._t, ms, info["generation"], threading.current_thread().name))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for gen in (0, 1, 2):
            ms = [r[1] for r in self.runs if r[2] == gen]
            out[f"gen{gen}"] = {"n": len(ms), "total_ms": round(sum(ms), 1), "max_ms": round(max(ms, default=0.0), 1)}
        return out


GC = GcLog()


class Sampler(threading.Thread):
    """Every thread's Python stack every `every_s` while `on`; samples are (ns after the window's mark, lateness ms,
    {thread name: stack})."""

    def __init__(self, every_s: float) -> None:
        super().__init__(name="seam-sampler", daemon=True)
        self.every_s = every_s
        self.on = False
        self.mark_ns = 0
        self.samples: list[tuple[int, float, dict[str, str]]] = []

    def start_window(self) -> None:
        with record_function("seam:mark"):
            self.mark_ns = sampled_mark[0] = time.perf_counter_ns()
        self.samples = []
        self.on = True

    def run(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter_ns()
        while True:
            time.sleep(self.every_s)
            now = time.perf_counter_ns()
            late_ms = (now - last) / 1e6 - self.every_s * 1e3
            last = now
            if not self.on:
                continue
            names = {t.ident: t.name for t in threading.enumerate()}
            stacks = {names.get(i, str(i)): short_stack(f) for i, f in sys._current_frames().items() if i != me}
            self.samples.append((now - self.mark_ns, round(late_ms, 2), stacks))


def explain(sampled: list[Any], start: int, end: int) -> dict[str, Any]:
    """Per thread, the stacks sampled between start and end (ns after the mark), most seen first; and the latest
    samples' lateness."""
    seen: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    late = []
    for t, late_ms, stacks in sampled:
        if start <= t <= end:
            late.append(late_ms)
            for name, st in stacks.items():
                seen[name][st] += 1
    mark = sampled_mark[0]
    collections_in = [
        f"gen{g} {ms:.1f} ms in {name}" for t, ms, g, name in GC.runs if t - mark < end and t - mark + ms * 1e6 > start
    ]
    return {
        "samples": len(late),
        "max_late_ms": max(late, default=0.0),
        "gc": collections_in,
        "stacks": {n: c.most_common(4) for n, c in seen.items()},
    }


sampled_mark = [0]  # the open window's mark (perf_counter ns), for the garbage collections' times


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def by_call(gaps: list[dict[str, Any]]) -> dict[str, float]:
    """Gap time per labelled host call that overlapped it (a gap beside two calls counts for both; "-": none)."""
    out: dict[str, float] = {}
    for g in gaps:
        for name in g["host"] or ["-"]:
            out[name] = round(out.get(name, 0.0) + g["ms"], 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class Windows:
    """trainer.after_step: counts steps and opens/closes the two profiler windows."""

    def __init__(self, seam_epoch: int, around: int, names: list[str], sampler: Sampler | None = None):
        self.seam_epoch, self.around, self.names = seam_epoch, around, names
        self.sampler = sampler
        self.explain_ms = 20.0
        self.step = 0
        self.plan: list[tuple[str, int, int]] = []
        self.prof: Any = None
        self.results: dict[str, Any] = {}
        self.min_gap_ms = 0.3

    def __call__(self, tr: Any) -> None:
        self.plan_for(tr)
        self.step += 1
        self.open(self.step)

    def plan_for(self, tr: Any) -> None:
        if not self.plan:
            nb = tr.s.sampler.batches_per_epoch()
            end = (self.seam_epoch + 1) * nb
            mid = end + nb // 2
            windows = {
                "seam": (end - self.around, end + self.around),
                "mid": (mid - self.around, mid + self.around),
                "epoch": (end - 1, end + nb),
                "first": (0, nb),
            }
            self.plan = [(n, *windows[n]) for n in self.names]

    def open(self, step: int) -> None:
        """Starts or stops the window that starts or ends after this many steps (0: before the first)."""
        for name, first, last in self.plan:
            if step == first:
                sync()
                self.prof = profile(activities=[ProfilerActivity.CPU, *[ProfilerActivity.CUDA] * CUDA])
                self.prof.start()
                if self.sampler is not None:
                    self.sampler.start_window()
            elif step == last and self.prof is not None:
                sync()
                self.prof.stop()
                sampled = None
                if self.sampler is not None:
                    self.sampler.on = False
                    sampled = self.sampler.samples
                self.results[name] = analyse(self.prof, self.min_gap_ms, sampled, self.explain_ms)
                self.prof = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("keys", nargs="*", help="training keys, key=value")
    ap.add_argument("--seam-epoch", type=int, default=3)
    ap.add_argument("--around", type=int, default=8)
    ap.add_argument("--min-gap-ms", type=float, default=0.3)
    ap.add_argument("--windows", default="seam,mid", help="comma-separated: seam, mid, epoch, first")
    ap.add_argument("--sample-ms", type=float, default=0.0, help="sample every thread's stack this often (0: off)")
    ap.add_argument("--explain-ms", type=float, default=20.0, help="print the sampled stacks beside gaps this long")
    ap.add_argument("--out")
    a = ap.parse_args()
    keys: dict[str, Any] = dict(k.split("=", 1) for k in a.keys)
    label_calls()
    sampler = Sampler(a.sample_ms / 1e3) if a.sample_ms > 0 else None
    if sampler is not None:
        sampler.start()
    windows = Windows(a.seam_epoch, a.around, a.windows.split(","), sampler)
    windows.min_gap_ms, windows.explain_ms = a.min_gap_ms, a.explain_ms
    train_epoch = trainer.Trainer._train_epoch

    def hooked(self: Any, epoch: int, it: Any) -> None:
        self.after_step = windows
        if epoch == 0 and "first" in windows.names:
            windows.plan_for(self)
            windows.open(0)
        return train_epoch(self, epoch, it)

    trainer.Trainer._train_epoch = hooked  # type: ignore[method-assign]
    from libreyolo import LibreYOLO

    model = LibreYOLO(keys.pop("model", "LibreYOLO9t"))
    model.train(**{"project": "/tmp/seam_gaps", "exist_ok": "true", **keys})
    for name, r in windows.results.items():
        print(f"== {name}: {r.get('kernels')} kernels, span {r.get('span_ms')} ms, busy {r.get('busy_ms')} ms "
              f"({r.get('busy_frac')}), gaps >= {a.min_gap_ms} ms: {r.get('gaps_ms_total')} ms")  # fmt: skip
        print(f"   gap ms by host call: {r.get('gap_ms_by_host_call')}")
        for g in r.get("gaps", [])[:60]:
            print(f"   gap at {g['at_ms']:9.2f} ms  {g['ms']:7.2f} ms  host: {', '.join(g['host']) or '-'}")
            th = g.get("threads")
            if th:
                print(f"      {th['samples']} samples, the latest {th['max_late_ms']} ms late; gc: {th['gc']}")
                for tname, stacks in th["stacks"].items():
                    for st, n in stacks:
                        print(f"      {tname:>18} x{n:<3} {st}")
        for c in r.get("host_calls", []):
            if c["ms"] >= 1.0:
                print(f"   host {c['at_ms']:9.2f} ms  {c['ms']:7.2f} ms  {c['call']}")
    print(f"== garbage collections over the run: {GC.summary()}")
    print(f"   the longest: {sorted(GC.runs, key=lambda r: -r[1])[:8]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({**windows.results, "gc": GC.summary()}, f)


if __name__ == "__main__":
    main()
