"""Assemble profile.json (schema libreyolo.profile/v1) and profile_summary.json from a finished window."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import torch

from libreyolo.data.cpus import cpu_count
from libreyolo.engine.runners import NAMES as GRAPH_MODE_NAMES
from libreyolo.engine.step import PHASES
from libreyolo.gpuprocs import other_processes
from libreyolo.profiler.analysis import Trace, analyze_trace
from libreyolo.profiler.verdict import decide
from libreyolo.profiler.window import Window

if TYPE_CHECKING:
    from libreyolo.engine.trainer import Trainer

SCHEMA = "libreyolo.profile/v1"
SUMMARY_SCHEMA = "libreyolo.profile_summary/v1"
ARTIFACTS = {
    "timeline": "timeline.html",
    "trace": "profile_trace.json",
    "summary": "profile_summary.json",
    "profile": "profile.json",
}


def run_meta(trainer: Trainer) -> dict[str, Any]:
    from libreyolo import __version__

    s, c = trainer.s, trainer.cfg
    dev = s.device
    return {
        "model": f"{s.family.prefix}{s.size}",
        "data": str(s.data.yaml_path),
        "run_dir": str(s.run_dir),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
        "batch": s.batch_per_rank,
        "imgsz": c.imgsz,
        "amp": s.amp.enabled,
        "amp_dtype": s.amp.dtype,
        "workers": s.workers,
        "accumulate": s.accumulate,
        # the mode the run uses (auto resolved to full, true or false): the verdict's graph lever reads it
        "cuda_graph": GRAPH_MODE_NAMES[s.graph_mode],
        "cuda_graph_setting": str(c.cuda_graph).lower(),
        "cache": str(c.cache).lower(),
        "channels_last": bool(c.channels_last),
        "cpus": cpu_count(),
        "graph_full_step": bool(s.family.capture.full_step),
        "torch": torch.__version__,
        "libreyolo": __version__,
    }


def _memory(w: Window, steps: int) -> dict[str, Any]:
    """Allocator figures from torch's own counters: they hold even when CUPTI misses runtime calls."""
    if w.device.type != "cuda":
        return {
            "alloc_retries": 0,
            "ooms": 0,
            "stat_alloc_per_step": 0.0,
            "stat_malloc_per_step": 0.0,
            "stat_free_per_step": 0.0,
            "peak_allocated_mb": None,
            "peak_reserved_mb": None,
            "total_mb": None,
            "vram_frac": None,
            "reserved_frac": None,
            "device_used_frac": None,
            "other_process_mb": None,
            "other_processes": None,
        }
    b, a = w.mem_before, w.mem_after
    delta = lambda k: max(int(a.get(k, 0)) - int(b.get(k, 0)), 0)  # noqa: E731
    free, total = torch.cuda.mem_get_info(w.device)
    used = max(w.peak_reserved, total - free)
    # what the device holds beyond this process's reservation right now: other processes (and CUDA contexts)
    other = max(total - free - torch.cuda.memory_reserved(w.device), 0)
    return {
        "alloc_retries": delta("num_alloc_retries"),
        "ooms": delta("num_ooms"),
        "stat_alloc_per_step": (delta("num_device_alloc") + delta("num_device_free")) / max(steps, 1),
        "stat_malloc_per_step": delta("num_device_alloc") / max(steps, 1),
        "stat_free_per_step": delta("num_device_free") / max(steps, 1),
        "peak_allocated_mb": w.peak_allocated / 2**20,
        "peak_reserved_mb": w.peak_reserved / 2**20,
        "total_mb": total / 2**20,
        "vram_frac": used / total if total else None,
        "reserved_frac": w.peak_reserved / total if total else None,
        "device_used_frac": (total - free) / total if total else None,
        "other_process_mb": other / 2**20,
        "other_processes": other_processes(w.device),  # NVML's view, where nvidia-ml-py is installed
    }


def build_profile(w: Window, trace: Trace, meta: dict[str, Any]) -> dict[str, Any]:
    fig = w.figures()
    steps = w.unsync.steps
    on_cuda = w.device.type == "cuda"
    a = analyze_trace(trace, steps, on_cuda)
    mem = _memory(w, steps)
    headline = {
        "step_ms": fig["step_ms"],
        "data_ms": fig["data_ms"],
        "data_frac": fig["data_frac"],
        "img_s": fig["img_s"],
        "utilization": a["utilization"],
        "gpu_busy_ms_per_step": a["gpu_busy_ms_per_step"],
        "kernels_per_step": a["kernels_per_step"],
        "mean_kernel_us": a["mean_kernel_us"],
        "tensor_core_frac": a["tensor_core_frac"],
        "malloc_per_step": a["malloc_per_step"],
        "free_per_step": a["free_per_step"],
        # the trace's count, or the allocator's own counters when CUPTI saw fewer calls
        "alloc_calls_per_step": max(a["malloc_per_step"] + a["free_per_step"], mem["stat_alloc_per_step"]),
        "malloc_calls_per_step": max(a["malloc_per_step"], mem["stat_malloc_per_step"]),
        "free_calls_per_step": max(a["free_per_step"], mem["stat_free_per_step"]),
        "alloc_retries": mem["alloc_retries"],
        "ooms": mem["ooms"],
        "reserved_frac": mem["reserved_frac"],
        "device_used_frac": mem["device_used_frac"],
        "other_process_mb": mem["other_process_mb"],
        "other_processes": mem["other_processes"],
        "captures_in_window": a["captures"],
        # steps left out of the window because a CUDA graph was captured in them (window.py moves past them)
        "window_moved_past": list(w.moved),
        "peak_allocated_mb": mem["peak_allocated_mb"],
        "peak_reserved_mb": mem["peak_reserved_mb"],
        "total_mb": mem["total_mb"],
        "vram_frac": mem["vram_frac"],
        "synced_step_ms": fig["synced_step_ms"],
        "steps_to_verdict_end": w.warmup_steps
        + steps,  # steps trained from attach to the end of the unsynchronised half
    }
    verdict = decide(headline, meta)
    synced = fig["synced_ms"]
    total_synced = sum(synced.values()) or 1.0
    phases = [
        {
            "name": p,
            "host_ms": fig["host_ms"].get(p, 0.0),
            "gpu_ms": a["gpu_ms"].get(p, 0.0),
            # of gpu_ms, the kernels a captured submodule's graph replayed (cuda_graph=true with a plan of
            # submodules, e.g. RT-DETR's backbone + encoder); the rest of the phase ran eager
            "replayed_gpu_ms": a["replayed_gpu_ms"].get(p, 0.0),
            "synced_ms": synced.get(p, 0.0),
            "share": synced.get(p, 0.0) / total_synced,
        }
        for p in PHASES
    ]
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "meta": meta,
        "window": {
            "requested_warmup": w.plan.warmup,
            "requested_steps": w.plan.unsync + w.plan.sync,
            "accumulate": meta["accumulate"],
            "warmup_steps": w.warmup_steps,
            "unsync_steps": steps,
            "sync_steps": w.synced.steps,
            "segments": w.unsync.segments,
            "traced_steps": a["traced_steps"],
            "steps_seen": w.seen,
            "moved_past_captures": list(w.moved),
            "drain_steps": w.drain_steps,
        },
        "headline": headline,
        "verdict": verdict.to_dict(),
        "phases": phases,
        "categories": a["categories"],
        "kernels": a["kernels"],
        "cpu_ops": a["cpu_ops"],
        "artifacts": dict(ARTIFACTS),
    }


def summary_from_profile(p: dict[str, Any]) -> dict[str, Any]:
    """profile_summary.json: the few numbers a person or a dashboard wants, without the kernel tables."""
    h, m = p["headline"], p["meta"]
    return {
        "schema": SUMMARY_SCHEMA,
        "meta": {k: m[k] for k in ("model", "device", "device_name", "batch", "imgsz", "amp", "amp_dtype", "workers")},
        "window": p["window"],
        "real_step": {k: h[k] for k in ("step_ms", "data_ms", "img_s", "data_frac", "utilization")},
        "phases_ms": {r["name"]: r["synced_ms"] for r in p["phases"]},
        "verdict": p["verdict"]["name"],
        "why": p["verdict"]["why"],
        "levers": p["verdict"]["levers"],
        "peak_vram_mb": {
            "allocated": h["peak_allocated_mb"],
            "reserved": h["peak_reserved_mb"],
            "total": h["total_mb"],
        },
    }
