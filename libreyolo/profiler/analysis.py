"""Read the first half's Chrome trace (torch.profiler's export): GPU busy time, kernels, allocator calls, CPU ops.

Everything is restricted to the window's segments (`libreyolo::segment` ranges: from a step's data wait to the
synchronize that closes the segment), so validation or checkpointing between epochs never leaks in. CPU ops
and GPU kernels share the trace's clock, which is what lets utilization be a plain ratio."""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from libreyolo.engine.step import PHASES
from libreyolo.profiler.window import ANNOTATION

KERNEL_CATS = ("kernel",)
COPY_CATS = ("gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
MALLOC_CALLS = {"cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemAlloc_v2", "cuMemCreate"}
FREE_CALLS = {"cudaFree", "cudaFreeAsync", "cuMemFree", "cuMemFree_v2", "cuMemRelease"}
CAPTURE_CALLS = {
    "cudaStreamBeginCapture",
    "cudaStreamBeginCapture_v2",
    "cuStreamBeginCapture",
    "cuStreamBeginCapture_v2",
}

# order matters: cuDNN's batch-norm kernels are norms, implicit-GEMM convolutions are convolutions, not GEMMs
_CATEGORY_RULES = (
    ("norm", re.compile(r"batch_?norm|bn_fw|bn_bw|layer_?norm|group_?norm|welford", re.I)),
    ("conv", re.compile(r"conv|implicit_?gemm|winograd|fprop|dgrad|wgrad|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|matmul|cublas|cutlass|nvjet|\bmm_|_mm\b|bmm", re.I)),
    ("reduction", re.compile(r"reduce|softmax|argmax|argmin|topk|sort|scan|cub::|sum_|_sum|mean|norm_kernel", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|foreach|fused_adam|fused_sgd", re.I)),
    (
        "elementwise",
        re.compile(
            r"elementwise|vectorized|unrolled|pointwise|copy|fill|index|cat_|where|clamp|sigmoid|silu|add|mul", re.I
        ),
    ),
)
# kernel names that say they run on tensor cores (mma/xmma/wgmma families, tensor-op GEMMs, cuBLASLt's nvjet)
_TENSOR_CORE = re.compile(
    r"h884|h1688|h16816|s1688|s16816|i8816|hmma|imma|tensorop|xmma|wgmma|gmma|_tf32|nvjet|bf16.*gemm|gemm.*bf16", re.I
)


def kernel_category(name: str, cat: str = "kernel") -> str:
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    for label, rx in _CATEGORY_RULES:
        if rx.search(name):
            return label
    return "other"


def is_tensor_core(name: str) -> bool:
    return bool(_TENSOR_CORE.search(name))


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: overlapping kernels on several streams count once."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


@dataclass
class Trace:
    """The window's slice of a Chrome trace, sorted into what the analysis and the timeline need."""

    segments: list[tuple[float, float]]
    steps: list[dict] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    copies: list[dict] = field(default_factory=list)
    runtime: list[dict] = field(default_factory=list)
    cpu_ops: list[dict] = field(default_factory=list)
    replays: list[dict] = field(default_factory=list)  # host ranges of submodule graph replays (engine/subgraphs.py)

    @property
    def wall_us(self) -> float:
        return sum(e - s for s, e in self.segments)

    def inside(self, ts: float) -> bool:
        i = bisect.bisect_right(self.segments, (ts, float("inf"))) - 1
        return i >= 0 and self.segments[i][0] <= ts <= self.segments[i][1]


REPLAY_LABEL = "captured "  # engine/subgraphs.py's record_function label around each submodule graph replay


def slice_trace(trace: dict[str, Any]) -> Trace:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    segs = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "user_annotation" and e.get("name") == ANNOTATION + "segment"
    )
    t = Trace(segments=segs)
    for e in events:
        cat, name = e.get("cat", ""), e.get("name", "")
        if not t.inside(float(e["ts"])):
            continue
        if cat == "user_annotation" and name.startswith(ANNOTATION):
            short = name[len(ANNOTATION) :]
            if short == "step":
                t.steps.append(e)
            elif short in PHASES:
                t.phases.append(e)
        elif cat == "user_annotation" and name.startswith(REPLAY_LABEL):
            t.replays.append(e)
        elif cat in KERNEL_CATS:
            t.kernels.append(e)
        elif cat in COPY_CATS:
            t.copies.append(e)
        elif cat in RUNTIME_CATS:
            t.runtime.append(e)
        elif cat == "cpu_op":
            t.cpu_ops.append(e)
    t.phases.sort(key=lambda e: e["ts"])
    t.replays.sort(key=lambda e: e["ts"])
    return t


class PhaseLookup:
    """Which phase (data, forward, ...) was running on the host at a time: kernels belong to the phase that
    launched them, wherever the GPU ran them (the autograd thread launches inside the backward phase)."""

    def __init__(self, phases: list[dict]):
        self.starts = [float(p["ts"]) for p in phases]
        self.phases = phases

    def at(self, ts: float) -> int | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i >= 0 and ts <= self.starts[i] + float(self.phases[i]["dur"]):
            return i
        return None


def kernel_launches(t: Trace) -> list[float | None]:
    """The host time of each kernel's launch (its runtime call, by CUDA correlation id), or None."""
    launch_ts = {}
    for r in t.runtime:
        corr = (r.get("args") or {}).get("correlation")
        if corr is not None:
            launch_ts[corr] = float(r["ts"])
    return [launch_ts.get((k.get("args") or {}).get("correlation")) for k in t.kernels]


def kernel_phases(t: Trace, launches: list[float | None] | None = None) -> list[int | None]:
    """Index into t.phases of the phase that launched each kernel (by CUDA correlation id), or None."""
    lookup = PhaseLookup(t.phases)
    return [lookup.at(ts) if ts is not None else None for ts in (launches or kernel_launches(t))]


def nesting(ops: list[dict]) -> list[int | None]:
    """Parent index of each CPU op (None at top level), rebuilt from time containment per thread."""
    parent: list[int | None] = [None] * len(ops)
    by_thread: dict[Any, list[int]] = defaultdict(list)
    for i, o in enumerate(ops):
        by_thread[(o.get("pid"), o.get("tid"))].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (float(ops[i]["ts"]), -float(ops[i]["dur"])))
        stack: list[int] = []
        for i in idx:
            ts = float(ops[i]["ts"])
            while stack and ts >= float(ops[stack[-1]]["ts"]) + float(ops[stack[-1]]["dur"]):
                stack.pop()
            parent[i] = stack[-1] if stack else None
            stack.append(i)
    return parent


def depths(ops: list[dict]) -> list[int]:
    """Nesting depth of each CPU op (0 at top level): the timeline draws one row per depth."""
    parent = nesting(ops)
    out = [0] * len(ops)
    for i in sorted(range(len(ops)), key=lambda i: (float(ops[i]["ts"]), -float(ops[i]["dur"]))):  # parents first
        out[i] = 0 if parent[i] is None else out[parent[i]] + 1
    return out


def cpu_self_times(ops: list[dict]) -> list[float]:
    """Self time of each CPU op: its duration minus its direct children's."""
    self_us = [float(o["dur"]) for o in ops]
    for i, p in enumerate(nesting(ops)):
        if p is not None:
            self_us[p] -= float(ops[i]["dur"])
    return [max(v, 0.0) for v in self_us]


def analyze_trace(t: Trace, steps: int, on_cuda: bool) -> dict[str, Any]:
    """Headline GPU figures, per-kernel rows, categories, per-phase GPU time and top CPU ops, all per step."""
    steps = max(steps, 1)
    wall = t.wall_us
    busy = union_us((float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in t.kernels)
    kernel_us = sum(float(k["dur"]) for k in t.kernels)
    mallocs = sum(1 for r in t.runtime if r.get("name") in MALLOC_CALLS)
    frees = sum(1 for r in t.runtime if r.get("name") in FREE_CALLS)
    captures = sum(1 for r in t.runtime if r.get("name") in CAPTURE_CALLS)
    kernels, phase_gpu_us, replayed_us = _kernel_rows(t, steps, kernel_us)
    tc_us = sum(r["ms_per_step"] for r in kernels if r["tensor_core"]) * 1000 * steps
    return {
        "trace_wall_ms_per_step": wall / 1000 / steps,
        "traced_steps": len(t.steps),
        "utilization": (busy / wall if wall > 0 else None) if on_cuda and t.kernels else None,
        "gpu_busy_ms_per_step": busy / 1000 / steps,
        "kernels_per_step": len(t.kernels) / steps,
        "mean_kernel_us": kernel_us / len(t.kernels) if t.kernels else 0.0,
        "tensor_core_frac": tc_us / kernel_us if kernel_us else 0.0,
        "malloc_per_step": mallocs / steps,
        "free_per_step": frees / steps,
        "captures": captures,  # CUDA graph captures begun inside the window: their allocations are growth
        "gpu_ms": {
            p: phase_gpu_us.get(p, 0.0) / 1000 / steps for p in (*PHASES, "other") if p in phase_gpu_us or p in PHASES
        },
        "replayed_gpu_ms": {p: us / 1000 / steps for p, us in replayed_us.items()},
        "kernels": kernels,
        "categories": _categories(kernels),
        "cpu_ops": _cpu_ops(t, steps)[:50],
    }


def _kernel_rows(
    t: Trace, steps: int, kernel_us: float
) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, float]]:
    """One row per (kernel or copy name, phase), slowest first -> (rows, GPU us per phase, of that the us that a
    submodule graph's replay launched per phase)."""
    launches = kernel_launches(t)
    owner = kernel_phases(t, launches)
    replay = PhaseLookup(t.replays)
    phase_gpu_us: dict[str, float] = defaultdict(float)
    replayed_us: dict[str, float] = defaultdict(float)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for k, ph, ts in zip(t.kernels, owner, launches):
        phase = t.phases[ph]["name"][len(ANNOTATION) :] if ph is not None else "other"
        phase_gpu_us[phase] += float(k["dur"])
        if ts is not None and replay.at(ts) is not None:
            replayed_us[phase] += float(k["dur"])
        row = rows.setdefault((k["name"], phase), {"name": k["name"], "phase": phase, "us": 0.0, "count": 0})
        row["us"] += float(k["dur"])
        row["count"] += 1
    for c in t.copies:
        row = rows.setdefault(
            (c["name"], "copy"), {"name": c["name"], "phase": "copy", "us": 0.0, "count": 0, "cat": c.get("cat")}
        )
        row["us"] += float(c["dur"])
        row["count"] += 1
    gpu_total = kernel_us + sum(float(c["dur"]) for c in t.copies)
    kernels = []
    for r in rows.values():
        category = kernel_category(r["name"], r.get("cat", "kernel"))
        kernels.append(
            {
                "name": r["name"],
                "category": category,
                "phase": r["phase"],
                "ms_per_step": r["us"] / 1000 / steps,
                "pct_gpu": 100 * r["us"] / gpu_total if gpu_total else 0.0,
                "count_per_step": r["count"] / steps,
                "mean_us": r["us"] / r["count"],
                "tensor_core": category in ("conv", "gemm") and is_tensor_core(r["name"]),
            }
        )
    kernels.sort(key=lambda r: -r["ms_per_step"])
    return kernels, phase_gpu_us, replayed_us


def _categories(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cats: dict[str, dict[str, float]] = defaultdict(lambda: {"ms_per_step": 0.0, "pct_gpu": 0.0, "count_per_step": 0.0})
    for r in kernels:
        c = cats[r["category"]]
        for key in c:
            c[key] += r[key]
    return sorted(({"name": k, **v} for k, v in cats.items()), key=lambda r: -r["ms_per_step"])


def _cpu_ops(t: Trace, steps: int) -> list[dict[str, Any]]:
    """Host ops by self time, most first."""
    ops: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "self_us": 0.0, "total_us": 0.0})
    for o, su in zip(t.cpu_ops, cpu_self_times(t.cpu_ops)):
        a = ops[o["name"]]
        a["calls"] += 1
        a["self_us"] += su
        a["total_us"] += float(o["dur"])
    return sorted(
        (
            {
                "name": n,
                "calls_per_step": a["calls"] / steps,
                "self_ms_per_step": a["self_us"] / 1000 / steps,
                "total_ms_per_step": a["total_us"] / 1000 / steps,
            }
            for n, a in ops.items()
        ),
        key=lambda r: -r["self_ms_per_step"],
    )
