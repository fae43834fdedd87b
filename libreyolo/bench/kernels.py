"""Count GPU kernels per training step and per phase with torch.profiler (used by `libreyolo bench step`).

Launches are attributed to phases by time: each phase is a record_function range on the host, and every
CUDA runtime launch call inside that range belongs to it. Kernels replayed from a CUDA graph have no
launch call of their own, so they are counted from the device trace instead (as `graph`)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, ContextManager

import torch
from torch.profiler import ProfilerActivity, profile, record_function

LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")


class RecordPhases:
    """A phases object (see engine/step.py) that marks each phase as a profiler range."""

    def __call__(self, name: str) -> ContextManager:
        return record_function(f"phase::{name}")


def _is_device(e: Any) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and getattr(dt, "name", str(dt)).upper() in ("CUDA", "PRIVATEUSE1")


def count_kernels(run_steps: Callable[[Any], None], steps: int, use_cuda: bool) -> dict[str, Any]:
    """Profile `run_steps(phases)` (which runs `steps` steps) -> kernels/step in total and per phase,
    the mean kernel duration, and the GPU busy time (union of kernel intervals) per step."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    with profile(activities=acts) as prof:
        run_steps(RecordPhases())
        if use_cuda:
            torch.cuda.synchronize()
    phases, launches, kernels = [], [], []
    names: Counter = Counter()
    for e in prof.events():
        if _is_device(e):
            if not e.name.lower().startswith(("memcpy", "memset")):
                kernels.append((e.time_range.start, e.time_range.end))
                names[e.name[:90]] += 1
        elif e.name.startswith("phase::"):
            phases.append((e.time_range.start, e.time_range.end, e.name[7:]))
        elif e.name in LAUNCH_NAMES:
            launches.append(e.time_range.start)
    per_phase: Counter = Counter()
    phases.sort()
    for t in launches:
        owner = next((n for s, end, n in phases if s <= t <= end), "other")
        per_phase[owner] += 1
    graph_kernels = max(len(kernels) - len(launches), 0)
    if graph_kernels:
        per_phase["graph"] += graph_kernels
    busy = _union(kernels)
    dur = sum(e - s for s, e in kernels)
    return {
        "kernels_per_step": len(kernels) / steps if use_cuda else sum(per_phase.values()) / steps,
        "launches_per_step": len(launches) / steps,
        "per_phase": {k: v / steps for k, v in sorted(per_phase.items())},
        "mean_kernel_us": dur / max(len(kernels), 1),
        "gpu_busy_ms_per_step": busy / 1000 / steps,
        "top_kernels": {k: v / steps for k, v in names.most_common(25)},
    }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total
