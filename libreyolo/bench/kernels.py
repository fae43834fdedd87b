"""Count GPU kernels per training step and per phase with torch.profiler (used by `libreyolo bench step`).

The profiled window is read from torch.profiler's Chrome trace, whose categories say what each device event is:
`kernel` (counted), `gpu_memcpy` / `gpu_memset` (reported apart), `gpu_user_annotation` (a record_function range
mirrored on the GPU timeline: not work, never counted). Launches are attributed to phases by time: each phase is
a record_function range on the host, and every CUDA runtime launch call inside that range belongs to it. Kernels
replayed from a CUDA graph have no launch call of their own, so they are counted from the device trace instead
(as `graph`).

GPU busy time is the union of the kernels' intervals (kernels overlapping on several streams count once); the
plain sum of their durations is reported beside it. The busy fraction divides the union by the wall time of the
same profiled window, measured around it (synchronised before and after), so it cannot exceed 1: every kernel of
the window starts after its start and ends before the closing synchronize. (Dividing by a step time measured
without the profiler, as before, gave 1.77 for the host-bound eager step, which the profiler slows.)"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from libreyolo.profiler.analysis import COPY_CATS, KERNEL_CATS, union_us

LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
)


class RecordPhases:
    """A phases object (see engine/step.py) that marks each phase as a profiler range."""

    def __call__(self, name: str) -> AbstractContextManager[Any]:
        return record_function(f"phase::{name}")


def busy_figures(kernels: Iterable[tuple[float, float]], wall_us: float, steps: int) -> dict[str, float | None]:
    """From kernel [start, end) intervals in µs (any streams) and the wall time of the window they ran in:
    per step, the GPU busy time (union of the intervals), the plain sum of the kernels' durations (above the
    union when streams overlap), and the busy fraction busy / wall (None without a window)."""
    kernels = list(kernels)
    busy = union_us(kernels)
    steps = max(steps, 1)
    return {
        "gpu_busy_ms_per_step": busy / 1000 / steps,
        "kernel_time_sum_ms_per_step": sum(e - s for s, e in kernels) / 1000 / steps,
        "profiled_wall_ms_per_step": wall_us / 1000 / steps,
        "gpu_busy_frac": busy / wall_us if wall_us > 0 else None,
    }


def _trace_events(prof: Any) -> list[dict]:
    fd, path = tempfile.mkstemp(suffix=".json", prefix="libreyolo-bench-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e and "dur" in e]


def count_kernels(run_steps: Callable[[Any], None], steps: int, use_cuda: bool) -> dict[str, Any]:
    """Profile `run_steps(phases)` (which runs `steps` steps) -> kernels/step in total and per phase, copies/step,
    the mean kernel duration, the GPU busy time per step (union of kernel intervals) beside the sum of kernel
    durations, and the busy fraction of the profiled window's wall time. On a CPU every GPU figure is None
    and launches count what they can (none)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    with profile(activities=acts) as prof:
        if use_cuda:
            torch.cuda.synchronize()  # nothing launched before the window runs inside it
        t0 = time.perf_counter()
        run_steps(RecordPhases())
        if use_cuda:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    return summarize(_trace_events(prof), steps, wall_us, use_cuda)


def summarize(events: list[dict], steps: int, wall_us: float, use_cuda: bool) -> dict[str, Any]:
    """The figures count_kernels returns, from the window's Chrome-trace events ("X" events with cat, name, ts, dur)."""
    phases, launches, kernels, copies = [], [], [], []
    names: Counter = Counter()
    for e in events:
        cat, name, ts = e.get("cat", ""), e.get("name", ""), float(e["ts"])
        if cat in KERNEL_CATS:
            kernels.append((ts, ts + float(e["dur"])))
            names[name[:90]] += 1
        elif cat in COPY_CATS:
            copies.append(float(e["dur"]))
        elif cat == "user_annotation" and name.startswith("phase::"):
            phases.append((ts, ts + float(e["dur"]), name[7:]))
        elif name in LAUNCH_NAMES:
            launches.append(ts)
    per_phase: Counter = Counter()
    phases.sort()
    for t in launches:
        owner = next((n for s, end, n in phases if s <= t <= end), "other")
        per_phase[owner] += 1
    graph_kernels = max(len(kernels) - len(launches), 0)
    if graph_kernels:
        per_phase["graph"] += graph_kernels
    dur = sum(e - s for s, e in kernels)
    out: dict[str, Any] = {
        "kernels_per_step": len(kernels) / steps if use_cuda else sum(per_phase.values()) / steps,
        "launches_per_step": len(launches) / steps,
        "per_phase": {k: v / steps for k, v in sorted(per_phase.items())},
        "mean_kernel_us": dur / max(len(kernels), 1),
        "copies_per_step": len(copies) / steps,
        "copy_time_ms_per_step": sum(copies) / 1000 / steps,
        "top_kernels": {k: v / steps for k, v in names.most_common(25)},
    }
    if use_cuda:
        out.update(busy_figures(kernels, wall_us, steps))
    else:
        out.update(
            {
                "gpu_busy_ms_per_step": None,
                "kernel_time_sum_ms_per_step": None,
                "profiled_wall_ms_per_step": wall_us / 1000 / steps,
                "gpu_busy_frac": None,
            }
        )
    return out
