"""Verdict rules on headlines shaped like the two H200 reports that came out wrong (the issue's figures), and
the churn that must still be memory-pressure. Constructed from the reported figures; no GPU, milliseconds each."""

from types import SimpleNamespace

import pytest

from libreyolo.profiler.analysis import analyze_trace, slice_trace
from libreyolo.profiler.verdict import COMPUTE, HOST, MEMORY, UNKNOWN, decide

H200_MB = 143_771.0  # torch.cuda.mem_get_info total of an H200, MiB


def h200(**kw):
    """A CUDA headline with every figure result.build_profile records; quiet allocator, 10 GiB used."""
    h = {
        "step_ms": 190.0,
        "data_ms": 4.0,
        "data_frac": 0.02,
        "img_s": 334.0,
        "utilization": 0.93,
        "kernels_per_step": 900,
        "mean_kernel_us": 190.0,
        "tensor_core_frac": 0.7,
        "malloc_per_step": 0.0,
        "free_per_step": 0.0,
        "alloc_calls_per_step": 0.0,
        "malloc_calls_per_step": 0.0,
        "free_calls_per_step": 0.0,
        "alloc_retries": 0,
        "ooms": 0,
        "peak_allocated_mb": 9_500.0,
        "peak_reserved_mb": 10_240.0,
        "total_mb": H200_MB,
        "vram_frac": 10_240.0 / H200_MB,
        "reserved_frac": 10_240.0 / H200_MB,
        "device_used_frac": 10_800.0 / H200_MB,
        "other_process_mb": 560.0,
        "captures_in_window": 0,
        "steps_to_verdict_end": 60,
    }
    h.update(kw)
    return h


META_9S_FULL = {
    "device": "cuda:0",
    "batch": 64,
    "workers": 8,
    "cpus": 16,
    "amp": True,
    "amp_dtype": "bfloat16",
    "cuda_graph": "full",
    "graph_full_step": True,
}
GROWTH = dict(malloc_per_step=36.8, alloc_calls_per_step=36.8, malloc_calls_per_step=36.8)


def test_growth_only_mallocs_do_not_decide():
    """Issue case 1: 36.8 cudaMalloc per step, 0 cudaFree, 0 retries, 10 of 143 GB: the allocator growing."""
    v = decide(h200(**GROWTH), META_9S_FULL)
    assert v.name == COMPUTE, v.why
    assert "93%" in v.why  # the verdict comes from the step's own utilization
    assert "36.8 cudaMalloc per step with 0.0 cudaFree and 0 retries" in v.why and "growth, not churn" in v.why
    assert "unreliable" not in v.why
    assert v.try_overrides is None or "batch" not in v.try_overrides  # never a smaller batch on growth
    # growth under a low utilization is host-bound, still not memory
    assert decide(h200(utilization=0.4, **GROWTH), META_9S_FULL).name == HOST


def test_a_capture_inside_the_window_is_reported_and_its_allocations_do_not_decide():
    v = decide(h200(captures_in_window=1, **GROWTH), META_9S_FULL)
    assert v.name == COMPUTE
    assert "1 CUDA graph capture(s) ran inside the measured window" in v.why and "profile_warmup" in v.why
    assert v.evidence["captures_in_window"] == 1


def test_the_analysis_counts_captures_in_the_window():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "libreyolo::segment", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamBeginCapture", "ts": 10, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMalloc", "ts": 20, "dur": 1, "pid": 1, "tid": 1},
        # outside the window (warm-up): not counted
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamBeginCapture", "ts": 5000, "dur": 1, "pid": 1, "tid": 1},
    ]
    a = analyze_trace(slice_trace({"traceEvents": ev}), steps=1, on_cuda=True)
    assert a["captures"] == 1 and a["malloc_per_step"] == 1 and a["free_per_step"] == 0


META_9T_EAGER = {**META_9S_FULL, "batch": 16, "cuda_graph": "false", "graph_full_step": True}


def test_a_device_full_of_other_processes_is_a_headline_not_the_verdict():
    """Issue case 2: another process holds all but 4.5 GiB; this run reserved 3.4 GB, no allocator calls."""
    free = 4.5 * 1024
    other = H200_MB - free - 3_400.0
    h = h200(
        utilization=0.35,
        peak_allocated_mb=3_100.0,
        peak_reserved_mb=3_400.0,
        reserved_frac=3_400.0 / H200_MB,
        vram_frac=(H200_MB - free) / H200_MB,
        device_used_frac=(H200_MB - free) / H200_MB,
        other_process_mb=other,
    )
    v = decide(h, META_9T_EAGER)
    assert v.name == HOST and v.try_overrides == {"cuda_graph": True}
    assert v.why.startswith(
        "The device is 97% full: 132.6 GiB held outside this run's allocator (other processes, CUDA contexts), "
        "3.3 GiB reserved by this run"
    )
    assert "at its peak. The GPU ran kernels only 35% of the step" in v.why and "unreliable" not in v.why
    assert v.evidence["other_process_mb"] == pytest.approx(other)


def full_device(**kw):
    """Issue case 2's device: another process holds all but 4.5 GiB; this run reserved 3.4 GB."""
    free = 4.5 * 1024
    full = dict(
        peak_allocated_mb=3_100.0,
        peak_reserved_mb=3_400.0,
        reserved_frac=3_400.0 / H200_MB,
        vram_frac=(H200_MB - free) / H200_MB,
        device_used_frac=(H200_MB - free) / H200_MB,
        other_process_mb=H200_MB - free - 3_400.0,
    )
    return h200(**{**full, **kw})


def test_no_kernel_records_on_a_full_device_say_why_and_name_the_holder():
    """Issue case 2 on the H200: with the device full of another process every trial's trace held no kernel records
    (CUPTI allocates its record buffers on the device). No verdict, never memory-pressure: the why opens with the
    full device and its holder, then says the trace is empty because of it, and what to do."""
    procs = [{"pid": 4242, "name": "python3", "used_mb": 135_000.0}]
    v = decide(full_device(utilization=None, other_processes=procs), META_9T_EAGER)
    assert v.name == UNKNOWN and v.try_overrides is None
    assert v.why.startswith("The device is 97% full: 132.6 GiB held outside this run's allocator")
    assert "other processes on it (NVML): python3 (pid 4242) 131.8 GiB." in v.why
    assert (
        "The trace holds no GPU kernel records on a device this full (4.5 GiB of 140.4 GiB free): CUPTI, which records "
        "the kernels for torch.profiler, keeps its records in buffers it allocates on the device, and most likely "
        "could not allocate them, so GPU busy time is unknown"
    ) in v.why
    assert "Free the GPU, or profile with fewer other processes on it." in v.why
    assert v.levers[0] == (
        "free the GPU: 132.6 GiB of it is held outside this run (python3 (pid 4242)); stop those processes, or "
        "profile on a GPU that fewer processes share"
    )
    assert v.evidence["no_kernel_records"] == "device full" and "unreliable" not in v.why
    # without NVML's list the lever still says how much is held elsewhere
    lever = decide(full_device(utilization=None), META_9T_EAGER).levers[0]
    assert lever.startswith("free the GPU: 132.6 GiB of it is held outside this run;")


def test_no_kernel_records_on_a_device_with_room_blame_cuptis_attachment():
    v = decide(h200(utilization=None), META_9T_EAGER)
    assert v.name == UNKNOWN and v.evidence["no_kernel_records"] == "CUPTI did not attach"
    assert v.why.startswith("the trace holds no GPU kernel records, so GPU busy time is unknown")
    assert "full" not in v.why and v.levers[0].startswith("check that CUPTI can attach")
    # a full device whose holders were not measured (an older headline): the figure goes into the sentence itself
    v = decide(full_device(utilization=None, other_process_mb=None), META_9T_EAGER)
    assert v.name == UNKNOWN and v.why.startswith("the trace holds no GPU kernel records while the device was 97% full")
    assert v.levers[0].startswith("free the GPU: most of it is held outside this run;")


def test_a_window_after_the_loaders_queue_says_so_instead_of_the_caveat():
    """The window discards the steps the loader's queue can serve (profiler/prefetch.py): the why says that, and
    the old caveat (a window that may lie inside the queue) no longer applies."""
    meta = {**META_9T_EAGER, "workers": 15, "loader_queue": "33 prefetched batches (15 workers x 2 + 3 staged)"}
    v = decide(h200(utilization=0.4, steps_to_verdict_end=15), meta)
    assert v.name == HOST and "understated" not in v.why
    assert v.why.endswith(
        "The window started after the loader's 33 prefetched batches (15 workers x 2 + 3 staged) had been consumed: "
        "every measured batch was requested from the loader after the warmup and after any CUDA graph capture."
    )
    assert "understated" in decide(h200(utilization=0.4, steps_to_verdict_end=15), {**meta, "loader_queue": None}).why


def test_a_window_while_the_image_cache_fills_says_how_full_it_was():
    """cache=auto fills the RAM cache as the workers first decode each image, so a window in the first epoch sees a
    loader whose pace changes: the why gives the counts at both ends of the window, whatever the verdict; a cache
    full before the window (or none being filled) adds nothing."""
    meta = {**META_9T_EAGER, "cache": "auto", "image_cache": {"images": 800, "held_at_start": 612, "held_at_end": 700}}
    v = decide(h200(utilization=0.89, data_frac=0.02), meta)
    assert v.name == COMPUTE
    assert (
        "The image cache (cache=auto) was being filled: it held 612 of the 800 training images when the window "
        "started and 700 when it ended." in v.why
    )
    assert "cache=ram fills it before training starts" in v.why
    full = {**meta, "image_cache": {"images": 800, "held_at_start": 800, "held_at_end": 800}}
    assert "being filled" not in decide(h200(utilization=0.89), full).why
    assert "being filled" not in decide(h200(utilization=0.89), META_9T_EAGER).why


def test_real_churn_is_still_memory_pressure():
    v = decide(
        h200(
            utilization=0.6, free_per_step=12.0, free_calls_per_step=12.0, malloc_calls_per_step=12.0, alloc_retries=3
        ),
        META_9T_EAGER,
    )
    assert v.name == MEMORY and v.try_overrides == {"batch": 8}
    assert "12.0 cudaFree and 12.0 cudaMalloc calls per step" in v.why and "3 allocation(s)" in v.why
    # an OOM that was caught and recovered from is churn too
    v = decide(h200(ooms=1), META_9T_EAGER)
    assert v.name == MEMORY and v.try_overrides == {"batch": 8} and "1 out-of-memory" in v.why


def test_this_processs_reservation_at_the_edge_is_memory_but_no_batch_is_tried():
    h = h200(peak_reserved_mb=0.97 * H200_MB, reserved_frac=0.97, vram_frac=0.98, device_used_frac=0.98)
    v = decide(h, META_9T_EAGER)
    assert v.name == MEMORY and v.try_overrides is None and "this run reserved 97% of the device" in v.why
    assert "unreliable" not in v.why


@pytest.mark.parametrize(
    "graph,full_step,first_try",
    [
        ("false", True, {"cuda_graph": True}),
        ("true", True, {"cuda_graph": "full"}),  # cuda_graph=true left it host-bound: capture the whole step
        ("true", False, {"batch": 32}),  # the family cannot capture the whole step
        ("full", True, {"batch": 32}),
    ],
)
def test_host_bound_after_cuda_graph_true_tries_full_where_the_family_supports_it(graph, full_step, first_try):
    v = decide(h200(utilization=0.4), {**META_9T_EAGER, "cuda_graph": graph, "graph_full_step": full_step})
    assert v.name == HOST and v.try_overrides == first_try


# --- `profile run --try`: which lever is measured, and what the record says --------------------------------------


def test_a_smaller_batch_is_tried_only_after_churn_or_an_oom():
    from libreyolo.cli.profile_run import lever_refusal

    quiet = {"free_per_step": 0.0, "alloc_retries": 0, "ooms": 0, "malloc_per_step": 36.8}
    assert "only after allocator churn or an OOM" in lever_refusal(MEMORY, {"batch": 32}, quiet, 0)
    assert lever_refusal(MEMORY, {"batch": 32}, {**quiet, "free_per_step": 12.0}, 0) is None
    assert lever_refusal(MEMORY, {"batch": 32}, {**quiet, "alloc_retries": 2}, 0) is None
    assert lever_refusal(MEMORY, {"batch": 32}, {**quiet, "ooms": 1}, 0) is None
    assert lever_refusal(HOST, {"cuda_graph": "full"}, quiet, 0) is None
    assert "no lever" in lever_refusal(COMPUTE, None, quiet, 0)
    # a window that held a graph capture is not a clean "before"
    assert "not a clean 'before'" in lever_refusal(HOST, {"cuda_graph": "full"}, quiet, 2)


def test_try_says_plainly_when_the_lever_did_not_help(monkeypatch, tmp_path):
    from libreyolo.cli import profile_run as run

    def fake_trials(overrides, base, repeat, prefix, fresh=True):
        img_s = 330.0 if prefix == "try" else 334.0
        t = {"verdict": COMPUTE, "img_s": img_s, "step_ms": 190.0, "captures_in_window": 0}
        return {
            "trials": [t],
            "img_s": {"mean": img_s, "std": 0.0},
            "step_ms": {"mean": 190.0, "std": 0.0},
            "verdict": COMPUTE,
        }

    monkeypatch.setattr(run, "trials", fake_trials)
    trial = {
        "verdict": HOST,
        "try": {"cuda_graph": "full"},
        "lever": "cuda_graph=full",
        "evidence": {},
        "captures_in_window": 0,
    }
    before = {
        "trials": [trial],
        "img_s": {"mean": 334.0, "std": 0.0},
        "step_ms": {"mean": 190.0, "std": 0.0},
        "verdict": HOST,
    }
    r = run.try_first_lever({}, tmp_path, 1, before)
    assert r["speedup"] == pytest.approx(330 / 334)
    assert r["note"] == "the lever did not help: 334.0 img/s before, 330.0 after (0.99x)"
    # growth-only memory evidence: nothing is trained, the record says why
    trial.update(verdict=MEMORY, evidence={"free_per_step": 0.0, "alloc_retries": 0, "ooms": 0})
    trial["try"] = {"batch": 32}
    before["verdict"] = MEMORY
    r = run.try_first_lever({}, tmp_path, 1, before)
    assert r["after"] is None and "only after allocator churn" in r["note"]


def test_the_full_device_sentence_names_the_other_processes_nvml_reports():
    procs = [
        {"pid": 4242, "name": "python3", "used_mb": 135_000.0},
        {"pid": 77, "name": None, "used_mb": 500.0},
    ]
    free = 4.5 * 1024
    h = h200(
        utilization=0.35,
        peak_reserved_mb=3_400.0,
        reserved_frac=3_400.0 / H200_MB,
        device_used_frac=(H200_MB - free) / H200_MB,
        other_process_mb=H200_MB - free - 3_400.0,
        other_processes=procs,
    )
    v = decide(h, META_9T_EAGER)
    assert v.name == HOST
    assert (
        "3.3 GiB reserved by this run at its peak; other processes on it (NVML): python3 (pid 4242) 131.8 GiB, "
        "pid 77 (not visible from this process) 0.5 GiB. The GPU ran kernels only 35%"
    ) in v.why
    assert "NVML lists no other process" in decide({**h, "other_processes": []}, META_9T_EAGER).why


class FakeNVML:
    """The few pynvml calls gpuprocs makes, for one device holding this process and two others."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuid, procs):
        self.uuid, self.procs, self.calls = uuid, procs, []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return "GPU-other" if h == 0 else f"GPU-{self.uuid}"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(domain=-1, bus=-1, device=-1)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        assert h == 1, "the processes of torch's device, matched by UUID, not of NVML's device 0"
        return [SimpleNamespace(pid=pid, usedGpuMemory=mb) for pid, mb in self.procs]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []


def test_other_processes_come_from_nvml_without_this_one(monkeypatch):
    import os

    import torch

    from libreyolo import gpuprocs

    props = SimpleNamespace(uuid="1234-abcd", pci_domain_id=0, pci_bus_id=1, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    nv = FakeNVML("1234-abcd", [(os.getpid(), 2**30), (os.getppid(), 3 * 2**30), (999_999_999, None)])
    out = gpuprocs.other_processes(torch.device("cuda", 0), nv)
    assert [r["pid"] for r in out] == [os.getppid(), 999_999_999]  # largest first, this process left out
    assert (
        out[0]["used_mb"] == 3072.0
        and out[0]["name"]
        and out[1]
        == {
            "pid": 999_999_999,
            "name": None,
            "used_mb": None,
        }
    )
    assert nv.calls == ["init", "shutdown"]
    # NVML that cannot start, or no device that matches: no list rather than a wrong one
    nv.nvmlInit = lambda: (_ for _ in ()).throw(FakeNVML.NVMLError("driver"))
    assert gpuprocs.other_processes(torch.device("cuda", 0), nv) is None
    assert gpuprocs.other_processes(torch.device("cuda", 0), FakeNVML("9999", [])) is None
    assert gpuprocs.other_processes(torch.device("cpu")) is None
