"""One verdict per report, from the unsynchronised half only, checked in this order:

1. memory-pressure  allocator churn only: >= 2.5 cudaFree per step, allocator retries, an out-of-memory error that
                    was recovered from, or memory reserved by this process >= 95% of the device
2. dataloader       the step waits on input >= 20% of its time
3. compute          GPU utilization >= 80%
4. host / launch    otherwise: the GPU is fed too slowly

A CUDA run whose trace holds no kernel records gets "unknown: no GPU kernel records" instead of a guess, with the
likely cause: a device that was full (CUPTI allocates its kernel-record buffers on the device) or CUPTI that could
not attach. A CPU run (no GPU to be idle) gets dataloader or compute.

One-time growth (cudaMalloc calls with no cudaFree and no retry: the caching allocator growing, or a CUDA graph
capture allocating its pool) is reported in `why` but never decides. Neither does memory that other processes
hold: a device that is full because of them gets a leading sentence saying so, and the verdict comes from this
run's own figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libreyolo.profiler.loadernotes import loader_notes

MALLOC_PER_STEP = 5.0  # cudaMalloc per step worth reporting as growth (it never decides alone)
FREE_PER_STEP = 2.5  # cudaFree per step that is churn: memory handed back to the driver and taken again
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

    if meta.get("loader_queue"):  # the window discarded the queue's steps after its warmup (profiler/prefetch.py)
        return ""
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


def _gib(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB"


def memory_figures(h: dict[str, Any]) -> dict[str, Any]:
    """The allocator and memory figures the verdict reads, from a headline old or new (missing figures: 0/None).

    frees: cudaFree calls per step (the larger of the trace's and the allocator's own count); reserved_frac: this
    process's peak reserved memory over the device's total; device_frac / other_mb: the whole device's use and
    the part of it other processes hold, when the run recorded them."""
    frees = h.get("free_calls_per_step")
    if frees is None:
        frees = h.get("free_per_step", 0.0)
    mallocs = h.get("malloc_calls_per_step")
    if mallocs is None:
        mallocs = h.get("malloc_per_step", 0.0)
    total, reserved = h.get("total_mb"), h.get("peak_reserved_mb")
    reserved_frac = h.get("reserved_frac")
    if reserved_frac is None and total and reserved is not None:
        reserved_frac = reserved / total
    return {
        "malloc_per_step": float(mallocs or 0.0),
        "free_per_step": float(frees or 0.0),
        "alloc_retries": int(h.get("alloc_retries") or 0),
        "ooms": int(h.get("ooms") or 0),
        "reserved_frac": reserved_frac,
        "peak_reserved_mb": reserved,
        "total_mb": total,
        "device_frac": h.get("device_used_frac"),
        "other_mb": h.get("other_process_mb"),
        "other_processes": h.get("other_processes"),
        "captures": int(h.get("captures_in_window") or 0),
        "moved": [int(k) for k in h.get("window_moved_past") or []],
    }


def _process_list(procs: list[dict[str, Any]] | None) -> str:
    """'; other processes on it (NVML): python3 (pid 4242) 134.0 GiB, ...' or '' when NVML could not say."""
    if procs is None:
        return ""
    if not procs:
        return "; NVML lists no other process on the device"
    shown = []
    for p in procs[:5]:
        who = f"{p['name']} (pid {p['pid']})" if p.get("name") else f"pid {p['pid']} (not visible from this process)"
        shown.append(f"{who} {_gib(p['used_mb'])}" if p.get("used_mb") is not None else who)
    more = f" and {len(procs) - 5} more" if len(procs) > 5 else ""
    return "; other processes on it (NVML): " + ", ".join(shown) + more


def _full_of_others(m: dict[str, Any]) -> bool:
    """The device is >= 95% full while this run's own reservation is not: the memory is held outside this run."""
    own_edge = m["reserved_frac"] is not None and m["reserved_frac"] >= VRAM_EDGE
    return m["device_frac"] is not None and m["device_frac"] >= VRAM_EDGE and m["other_mb"] is not None and not own_edge


def _memory_notes(m: dict[str, Any], churn: bool) -> tuple[str, str]:
    """(leading sentence on a device that other processes fill, trailing sentences on growth and captures)."""
    lead = ""
    if _full_of_others(m):
        own = f"{_gib(m['peak_reserved_mb'])}" if m["peak_reserved_mb"] is not None else "an unknown amount"
        lead = (
            f"The device is {_pct(m['device_frac'])} full: {_gib(m['other_mb'])} held outside this run's allocator "
            "(other processes, CUDA contexts), "
            f"{own} reserved by this run at its peak{_process_list(m['other_processes'])}. "
        )
    tail = ""
    if not churn and m["malloc_per_step"] >= MALLOC_PER_STEP:
        tail += (
            f" The allocator made {m['malloc_per_step']:.1f} cudaMalloc per step with {m['free_per_step']:.1f} "
            f"cudaFree and {m['alloc_retries']} retries: growth, not churn, so it does not decide the verdict."
        )
    if m["captures"]:
        tail += (
            f" {m['captures']} CUDA graph capture(s) ran inside the measured window (cudaStreamBeginCapture in the "
            "trace): their steps' figures include capture work; a larger profile_warmup measures after them."
        )
    return lead, tail


def decide(h: dict[str, Any], meta: dict[str, Any]) -> Verdict:
    """h: headline figures (step_ms, data_ms, data_frac, utilization, kernels_per_step, mean_kernel_us,
    malloc/free calls per step, alloc_retries, ooms, peak_reserved_mb, total_mb, device_used_frac, ...);
    meta: the run's settings."""
    v = _decide(h, meta)
    m = memory_figures(h)
    if m["moved"]:
        steps = ", ".join(str(k) for k in m["moved"])
        v.why += (
            f" The window was moved past the CUDA graph capture(s) at step(s) {steps}: those steps are not measured."
        )
        v.evidence["window_moved_past"] = m["moved"]
    v.why += loader_notes(meta)
    if not meta["device"].startswith("cuda"):
        return v
    churn = m["free_per_step"] >= FREE_PER_STEP or m["alloc_retries"] > 0 or m["ooms"] > 0
    lead, tail = _memory_notes(m, churn)
    v.why = (lead + v.why[:1].upper() + v.why[1:] if lead else v.why) + tail
    v.evidence.update(
        malloc_per_step=m["malloc_per_step"],
        free_per_step=m["free_per_step"],
        ooms=m["ooms"],
        reserved_frac=m["reserved_frac"],
        device_used_frac=m["device_frac"],
        other_process_mb=m["other_mb"],
        captures_in_window=m["captures"],
    )
    return v


def _decide(h: dict[str, Any], meta: dict[str, Any]) -> Verdict:
    """The first of memory, dataloader, compute and host whose evidence holds (in that order: allocator churn makes
    the utilisation figures unreliable; a starved step cannot show its compute)."""
    on_cuda = meta["device"].startswith("cuda")
    util = h.get("utilization")
    m = memory_figures(h)
    evidence = {
        "data_frac": h["data_frac"],
        "utilization": util,
        "alloc_calls_per_step": h.get("alloc_calls_per_step", 0.0),
        "vram_frac": h.get("vram_frac"),
        "alloc_retries": m["alloc_retries"],
    }
    memory = _memory(h, meta, m, evidence) if on_cuda else None
    if memory is not None:
        return memory
    if h["data_frac"] >= DATA_FRAC:
        return _dataloader(h, meta, evidence)
    if not on_cuda:
        return Verdict(
            COMPUTE,
            f"on {meta['device']} the step is compute: data wait is {_pct(h['data_frac'])} (< {_pct(DATA_FRAC)}) of a "
            f"{h['step_ms']:.1f} ms step; the rest is the model's forward, loss, backward and optimizer (wall time).",
            ["train on a GPU (device=0)", "a smaller model or imgsz"],
            None,
            evidence,
        )
    if util is None:
        return _no_kernel_records(h, m, evidence)
    kernels = f"{h['kernels_per_step']:.0f} kernels per step, mean {h['mean_kernel_us']:.1f} µs"
    if util >= UTILIZATION:
        return _gpu_bound(h, meta, util, kernels, evidence)
    return _host(h, meta, util, kernels, evidence)


def _memory(h: dict[str, Any], meta: dict[str, Any], m: dict[str, Any], evidence: dict[str, Any]) -> Verdict | None:
    """Memory where the allocator churned, retried or recovered from an OOM, or the run reserved the device to
    its edge; else None."""
    batch, util = int(meta["batch"]), h.get("utilization")
    frees, retries, ooms, reserved = m["free_per_step"], m["alloc_retries"], m["ooms"], m["reserved_frac"]
    churn = frees >= FREE_PER_STEP or retries > 0 or ooms > 0
    edge = reserved is not None and reserved >= VRAM_EDGE
    if not (churn or edge):
        return None
    parts = []
    if frees >= FREE_PER_STEP:
        parts.append(
            f"the CUDA allocator made {frees:.1f} cudaFree and {m['malloc_per_step']:.1f} cudaMalloc calls per "
            f"step (threshold {FREE_PER_STEP:g} cudaFree)"
        )
    if retries > 0:
        parts.append(f"{retries} allocation(s) failed and were retried after freeing the cache")
    if ooms > 0:
        parts.append(f"{ooms} out-of-memory error(s) were raised and recovered from")
    if edge:
        parts.append(
            f"this run reserved {_pct(reserved)} of the device at its peak "
            f"({_gib(m['peak_reserved_mb'])} of {_gib(m['total_mb'])}, threshold {_pct(VRAM_EDGE)})"
        )
    util_txt = f" (measured {_pct(util)})" if util is not None else ""
    tail = f". Utilization figures{util_txt} are unreliable while the allocator churns." if churn else "."
    levers = [
        f"lower batch (batch={max(batch // 2, 1)}; now {batch})",
        "less activation memory: amp=true, a smaller imgsz, or a smaller model",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
    ]
    # a smaller batch is tried only after real churn or an OOM: reserved memory at the edge alone is the
    # caching allocator keeping what it took, which a smaller batch need not change
    lever = {"batch": max(batch // 2, 1)} if churn and batch > 1 else None
    return Verdict(MEMORY, "; ".join(parts) + tail, levers, lever, evidence)


def _dataloader(h: dict[str, Any], meta: dict[str, Any], evidence: dict[str, Any]) -> Verdict:
    batch, workers, cpus = int(meta["batch"]), int(meta["workers"]), int(meta.get("cpus", 1))
    step, data = h["step_ms"], h["data_ms"]
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


def _gpu_bound(h: dict[str, Any], meta: dict[str, Any], util: float, kernels: str, evidence: dict[str, Any]) -> Verdict:
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


def _host(h: dict[str, Any], meta: dict[str, Any], util: float, kernels: str, evidence: dict[str, Any]) -> Verdict:
    batch = int(meta["batch"])
    graph = str(meta.get("cuda_graph", "false")).lower()
    graph_on = graph not in ("false", "0", "")
    full_ok = bool(meta.get("graph_full_step"))  # the family can capture the whole step (Family.capture.full_step)
    levers = [f"larger batch (batch={2 * batch}; now {batch})", "fewer per-step host syncs (.item(), .cpu(), printing)"]
    if not graph_on:
        levers.insert(0, "cuda_graph=true: one graph replay per step instead of launching every kernel")
        lever: dict[str, Any] = {"cuda_graph": True}
    elif graph != "full" and full_ok:
        levers.insert(0, "cuda_graph=full: capture the whole step (loss, optimizer, EMA), not only the network")
        lever = {"cuda_graph": "full"}
    else:
        lever = {"batch": 2 * batch}
    return Verdict(
        HOST,
        f"the GPU ran kernels only {_pct(util)} of the step (threshold {_pct(UTILIZATION)}), idle "
        f"{_pct(1 - util)}, and the data wait covers only {_pct(h['data_frac'])} of it: the rest of the idle time "
        f"is host time ({kernels})." + _prefetch_caveat(h, meta),
        levers,
        lever,
        evidence,
    )


CUPTI_ATTACH = (
    "check that CUPTI can attach: no other profiler (nsys, ncu) running, and profiling allowed for this user "
    "(NVreg_RestrictProfilingToAdminUsers=0)"
)


def _holders(m: dict[str, Any]) -> str:
    """Who holds the rest of the device: the processes NVML names, else the amount held outside this run."""
    named = [f"{p['name']} (pid {p['pid']})" for p in m["other_processes"] or [] if p.get("name")][:3]
    amount = _gib(m["other_mb"]) if m["other_mb"] is not None else "most"
    return f"{amount} of it is held outside this run" + (f" ({', '.join(named)})" if named else "")


def _no_kernel_records(h: dict[str, Any], m: dict[str, Any], evidence: dict[str, Any]) -> Verdict:
    """A CUDA run whose trace holds no kernel records: GPU busy time is unknown, so no verdict; the why says the
    likely cause. CUPTI (torch.profiler's CUDA tracing) writes kernel records into buffers it allocates in device
    memory when tracing starts: on a device that is full those allocations can fail and the kernels go unrecorded,
    which the profiler cannot observe directly, only infer from the device being full. Otherwise CUPTI did not
    attach (another profiler, or profiling restricted to admin users)."""
    unknown = (
        "GPU busy time is unknown: no verdict rather than a false one "
        f"(data wait {_pct(h['data_frac'])} of a {h['step_ms']:.1f} ms step)."
    )
    frac = m["device_frac"]
    if frac is None or frac < VRAM_EDGE:
        evidence["no_kernel_records"] = "CUPTI did not attach"
        return Verdict(UNKNOWN, f"the trace holds no GPU kernel records, so {unknown}", [CUPTI_ATTACH], None, evidence)
    evidence["no_kernel_records"] = "device full"
    total = m["total_mb"]
    free = f"{_gib(total * (1 - frac))} of {_gib(total)} free" if total else f"{_pct(1 - frac)} free"
    # decide() opens the why with the full device and who fills it when other processes do; the figures then
    # need not be said twice
    where = "on a device this full" if _full_of_others(m) else f"while the device was {_pct(frac)} full"
    why = (
        f"the trace holds no GPU kernel records {where} ({free}): CUPTI, which records the kernels for "
        "torch.profiler, keeps its records in buffers it allocates on the device, and most likely could not allocate "
        f"them, so {unknown} Free the GPU, or profile with fewer other processes on it."
    )
    levers = [
        f"free the GPU: {_holders(m)}; stop those processes, or profile on a GPU that fewer processes share",
        CUPTI_ATTACH,
    ]
    return Verdict(UNKNOWN, why, levers, None, evidence)
