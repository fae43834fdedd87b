"""One verdict per report, from the unsynchronised half only, checked in this order:

1. memory-pressure  allocator thrash (>= 5 cudaMalloc/cudaFree per step), allocator retries, or VRAM at the edge
2. dataloader       the step waits on input >= 20% of its time
3. compute          GPU utilization >= 80%
4. host / launch    otherwise: the GPU is fed too slowly

A CUDA run whose trace holds no kernel records gets "unknown: no GPU kernel records" instead of a guess; a
CPU run (no GPU to be idle) gets dataloader or compute."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MALLOC_PER_STEP = 5.0
DATA_FRAC = 0.20
UTILIZATION = 0.80
VRAM_EDGE = 0.95

MEMORY, DATALOADER, COMPUTE, HOST = "memory-pressure", "dataloader", "compute", "host / launch"
UNKNOWN = "unknown: no GPU kernel records"
VERDICTS = (MEMORY, DATALOADER, COMPUTE, HOST, UNKNOWN)


@dataclass
class Verdict:
    name: str
    why: str
    levers: list[str]
    # the first lever as config overrides, for `profile run --try`; None when there is nothing to measure
    try_overrides: dict[str, Any] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "why": self.why,
            "levers": self.levers,
            "try": self.try_overrides,
            "evidence": self.evidence,
        }


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _prefetch_caveat(h: dict[str, Any], meta: dict[str, Any]) -> str:
    """A loader slower than the step can still show no data wait while the window is served from batches its
    workers queued before it (during cuDNN autotuning and graph capture, say): say so when that is possible."""
    from libreyolo.data.loader import prefetch_factor

    workers, seen = int(meta["workers"]), h.get("steps_to_verdict_end")
    per_worker = prefetch_factor(workers) or 0
    queued = workers * per_worker
    if not queued or seen is None or seen > queued:
        return ""
    return (
        f" Data wait may be understated: the loader holds up to {queued} batches ready ({workers} workers x "
        f"{per_worker}) and this window ended {seen} steps into the run, so batches prepared before it may have "
        f"served it; profile_warmup={queued} measures after that queue has had to drain."
    )


def decide(h: dict[str, Any], meta: dict[str, Any]) -> Verdict:
    """h: headline figures (step_ms, data_ms, data_frac, utilization, kernels_per_step, mean_kernel_us,
    alloc_calls_per_step, alloc_retries, vram_frac, ...); meta: the run's settings."""
    on_cuda = meta["device"].startswith("cuda")
    batch, workers, cpus = int(meta["batch"]), int(meta["workers"]), int(meta.get("cpus", 1))
    step, data = h["step_ms"], h["data_ms"]
    util = h.get("utilization")
    churn = h.get("alloc_calls_per_step", 0.0)
    vram = h.get("vram_frac")
    retries = h.get("alloc_retries", 0)
    evidence = {
        "data_frac": h["data_frac"],
        "utilization": util,
        "alloc_calls_per_step": churn,
        "vram_frac": vram,
        "alloc_retries": retries,
    }

    if on_cuda and (churn >= MALLOC_PER_STEP or retries > 0 or (vram is not None and vram >= VRAM_EDGE)):
        parts = []
        if churn >= MALLOC_PER_STEP:
            parts.append(
                f"the CUDA allocator made {churn:.1f} cudaMalloc/cudaFree calls per step (threshold "
                f"{MALLOC_PER_STEP:g})"
            )
        if retries > 0:
            parts.append(f"{retries} allocation(s) failed and were retried after freeing the cache")
        if vram is not None and vram >= VRAM_EDGE:
            parts.append(f"peak memory reached {_pct(vram)} of the GPU (threshold {_pct(VRAM_EDGE)})")
        util_txt = f" (measured {_pct(util)})" if util is not None else ""
        return Verdict(
            MEMORY,
            "; ".join(parts) + f". Utilization figures{util_txt} are unreliable while the allocator thrashes.",
            [
                f"lower batch (batch={max(batch // 2, 1)}; now {batch})",
                "less activation memory: amp=true, a smaller imgsz, or a smaller model",
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
            ],
            {"batch": max(batch // 2, 1)} if batch > 1 else None,
            evidence,
        )

    if h["data_frac"] >= DATA_FRAC:
        more = min(cpus, max(2 * workers, workers + 2))
        lever = {"workers": more} if more > workers else {"cache": "ram"}
        first = (
            f"more loader workers (workers={more}; now {workers}, {cpus} CPUs)"
            if "workers" in lever
            else f"cache=ram (or cache=disk): workers={workers} already uses the {cpus} CPUs"
        )
        others = (
            ["cache=ram (or cache=disk) to skip image decoding"]
            if "workers" in lever
            else [f"more CPUs: {workers} workers are busy"]
        )
        return Verdict(
            DATALOADER,
            f"the step waited on the data loader {_pct(h['data_frac'])} of its time ({data:.1f} of {step:.1f} ms per "
            "step, "
            f"threshold {_pct(DATA_FRAC)}, workers={workers}): the model cannot train faster than batches arrive.",
            [
                first,
                *others,
                "lighter augmentation (mosaic=0, smaller scale/degrees)",
                f"larger batch (batch={2 * batch}) to amortise per-batch overhead",
            ],
            lever,
            evidence,
        )

    if not on_cuda:
        return Verdict(
            COMPUTE,
            f"on {meta['device']} the step is compute: data wait is {_pct(h['data_frac'])} (< {_pct(DATA_FRAC)}) of a "
            f"{step:.1f} ms step; the rest is the model's forward, loss, backward and optimizer (wall time).",
            ["train on a GPU (device=0)", "a smaller model or imgsz"],
            None,
            evidence,
        )

    if util is None:
        return Verdict(
            UNKNOWN,
            "the trace holds no GPU kernel records, so GPU busy time is unknown; no verdict rather than a false one "
            f"(data wait {_pct(h['data_frac'])} of a {step:.1f} ms step).",
            [
                "check that CUPTI can attach: no other profiler (nsys, ncu) running, and profiling allowed for this "
                "user "
                "(NVreg_RestrictProfilingToAdminUsers=0)"
            ],
            None,
            evidence,
        )

    kernels = f"{h['kernels_per_step']:.0f} kernels per step, mean {h['mean_kernel_us']:.1f} µs"
    if util >= UTILIZATION:
        bf16 = meta.get("amp") and meta.get("amp_dtype") == "bfloat16"
        levers = ([] if bf16 else ["amp=true amp_dtype=bfloat16: tensor-core math, no loss scaler"]) + [
            "or accept it: the GPU is the bottleneck, which is where it should be",
            "channels_last=true",
        ]
        tc = f"; {_pct(h.get('tensor_core_frac', 0.0))} of kernel time on tensor cores"
        return Verdict(
            COMPUTE,
            f"the GPU ran kernels {_pct(util)} of the step (threshold {_pct(UTILIZATION)}): {kernels}{tc}."
            + _prefetch_caveat(h, meta),
            levers,
            None if bf16 else {"amp": True, "amp_dtype": "bfloat16"},
            evidence,
        )

    graph_on = str(meta.get("cuda_graph", "false")).lower() not in ("false", "0", "")
    levers = [f"larger batch (batch={2 * batch}; now {batch})", "fewer per-step host syncs (.item(), .cpu(), printing)"]
    if not graph_on:
        levers.insert(0, "cuda_graph=true: one graph replay per step instead of launching every kernel")
    return Verdict(
        HOST,
        f"the GPU ran kernels only {_pct(util)} of the step (threshold {_pct(UTILIZATION)}) and the loader is not the "
        "cause "
        f"(data wait {_pct(h['data_frac'])}): {kernels}; the host cannot launch work fast enough to keep the GPU fed."
        + _prefetch_caveat(h, meta),
        levers,
        {"cuda_graph": True} if not graph_on else {"batch": 2 * batch},
        evidence,
    )
