"""Trace analysis and verdict rules on constructed traces and figures (no training, milliseconds each)."""

import pytest

from libreyolo.profiler.analysis import analyze_trace, is_tensor_core, kernel_category, slice_trace, union_us
from libreyolo.profiler.verdict import COMPUTE, DATALOADER, HOST, MEMORY, UNKNOWN, decide


def X(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def synthetic_trace(steps=2, step_us=1000.0, kernel_us=100.0, kernels=4, mallocs=0, gap_kernels=True):
    """Segment [0, steps*step_us]; each step: data 0-100, forward 100-500 (launches the kernels), backward 500-900.
    A validation kernel sits between two segments and must not count."""
    ev, corr = [], 0
    ev.append(X("user_annotation", "libreyolo::segment", 0, steps * step_us))
    for s in range(steps):
        t = s * step_us
        ev += [
            X("user_annotation", "libreyolo::step", t, step_us - 10),
            X("user_annotation", "libreyolo::data", t, 100),
            X("user_annotation", "libreyolo::forward", t + 100, 400),
            X("user_annotation", "libreyolo::backward", t + 500, 400),
            X("cpu_op", "aten::conv2d", t + 110, 300),
            X("cpu_op", "aten::convolution", t + 120, 200),
        ]
        for k in range(kernels):
            corr += 1
            ev.append(X("cuda_runtime", "cudaLaunchKernel", t + 150 + k, 1, correlation=corr))
            ev.append(
                X(
                    "kernel",
                    "sm90_xmma_fprop_implicit_gemm_f16" if k % 2 else "vectorized_elementwise_kernel",
                    t + 200 + k * kernel_us,
                    kernel_us,
                    tid=7,
                    correlation=corr,
                    stream=7,
                )
            )
        for m in range(mallocs):
            ev.append(X("cuda_runtime", "cudaMalloc" if m % 2 else "cudaFree", t + 600 + m, 1))
    ev.append(X("user_annotation", "libreyolo::segment", 10 * step_us, step_us))  # a second segment, empty of steps
    if gap_kernels:
        ev.append(
            X("kernel", "validation_kernel", 5 * step_us, 3000, tid=7)
        )  # between the segments: outside the window
    return {"traceEvents": ev}


def test_union_counts_overlap_once():
    assert union_us([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert union_us([]) == 0


def test_categories_and_tensor_cores():
    assert kernel_category("sm90_xmma_fprop_implicit_gemm_f16f16") == "conv"
    assert kernel_category("ampere_sgemm_128x64_nn") == "gemm"
    assert kernel_category("void at::native::vectorized_elementwise_kernel<4>") == "elementwise"
    assert kernel_category("cudnn::bn_fw_tr_1C11_kernel_NCHW") == "norm"
    assert kernel_category("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == "memcpy"
    assert kernel_category("void at::native::reduce_kernel<512, 1>") == "reduction"
    assert is_tensor_core("sm80_xmma_gemm_f16f16_f16f32_nn") and not is_tensor_core("ampere_sgemm_128x64_nn")


def test_analysis_keeps_to_the_window_and_attributes_kernels_to_phases():
    t = slice_trace(synthetic_trace(steps=2, kernels=4, kernel_us=100, mallocs=6))
    a = analyze_trace(t, steps=2, on_cuda=True)
    assert len(t.segments) == 2 and a["traced_steps"] == 2
    assert a["kernels_per_step"] == 4 and a["mean_kernel_us"] == 100  # the validation kernel is outside every segment
    # 2 steps x 400 µs of kernels over 2000 + 1000 µs of segments
    assert a["utilization"] == pytest.approx(800 / 3000)
    assert a["malloc_per_step"] + a["free_per_step"] == 6
    assert a["gpu_ms"]["forward"] == pytest.approx(0.4) and a["gpu_ms"]["backward"] == 0
    names = {(r["name"], r["phase"]) for r in a["kernels"]}
    assert ("sm90_xmma_fprop_implicit_gemm_f16", "forward") in names
    conv = next(r for r in a["kernels"] if r["category"] == "conv")
    assert conv["tensor_core"] and conv["count_per_step"] == 2 and conv["pct_gpu"] == pytest.approx(50)
    assert a["tensor_core_frac"] == pytest.approx(0.5)
    conv2d = next(r for r in a["cpu_ops"] if r["name"] == "aten::conv2d")
    assert conv2d["self_ms_per_step"] == pytest.approx(0.1) and conv2d["total_ms_per_step"] == pytest.approx(0.3)


def test_cpu_trace_has_no_utilization():
    t = slice_trace(synthetic_trace(kernels=0, gap_kernels=False))
    assert analyze_trace(t, steps=2, on_cuda=False)["utilization"] is None


META = {
    "device": "cuda:0",
    "batch": 16,
    "workers": 4,
    "cpus": 16,
    "amp": True,
    "amp_dtype": "float16",
    "cuda_graph": "false",
}


def headline(**kw):
    h = {
        "step_ms": 100.0,
        "data_ms": 5.0,
        "data_frac": 0.05,
        "utilization": 0.5,
        "kernels_per_step": 1200,
        "mean_kernel_us": 9.5,
        "alloc_calls_per_step": 0.0,
        "alloc_retries": 0,
        "vram_frac": 0.3,
        "tensor_core_frac": 0.6,
    }
    h.update(kw)
    return h


@pytest.mark.parametrize(
    "figures,meta,verdict,first_try",
    [
        (
            dict(alloc_calls_per_step=12.0, malloc_per_step=6.0, free_per_step=6.0, data_frac=0.5),
            {},
            MEMORY,
            {"batch": 8},
        ),  # memory pressure (churn: frees) wins over everything
        # this run's reservation at the edge, no churn: memory-pressure, but no smaller batch is tried
        (dict(peak_reserved_mb=97_000.0, total_mb=100_000.0, utilization=0.95), {}, MEMORY, None),
        (dict(alloc_retries=3), {}, MEMORY, {"batch": 8}),
        (dict(data_frac=0.35, data_ms=35.0, utilization=0.95), {}, DATALOADER, {"workers": 8}),
        (dict(data_frac=0.35, data_ms=35.0), {"workers": 16}, DATALOADER, {"cache": "ram"}),  # no CPU left for workers
        (dict(utilization=0.85), {}, COMPUTE, {"amp": True, "amp_dtype": "bfloat16"}),
        (dict(utilization=0.85), {"amp_dtype": "bfloat16"}, COMPUTE, None),
        (dict(utilization=0.5), {}, HOST, {"cuda_graph": True}),
        (dict(utilization=0.5), {"cuda_graph": "true"}, HOST, {"batch": 32}),
        (dict(utilization=None), {}, UNKNOWN, None),  # a CUDA run whose trace has no kernels: no false verdict
        (dict(utilization=None, data_frac=0.1), {"device": "cpu"}, COMPUTE, None),
        (
            dict(utilization=None, data_frac=0.4, data_ms=40.0),
            {"device": "cpu", "workers": 0, "cpus": 2},
            DATALOADER,
            {"workers": 2},
        ),
    ],
)
def test_verdict_order_and_first_lever(figures, meta, verdict, first_try):
    v = decide(headline(**figures), {**META, **meta})
    assert v.name == verdict and v.try_overrides == first_try and v.levers and v.why


def test_why_carries_the_evidence():
    v = decide(headline(utilization=0.31, kernels_per_step=1214, mean_kernel_us=9.8), META)
    assert (
        "31%" in v.why and "1214 kernels per step" in v.why and "9.8 µs" in v.why and "cuda_graph=true" in v.levers[0]
    )
    v = decide(headline(alloc_calls_per_step=38.0, malloc_per_step=19.0, free_per_step=19.0, utilization=0.4), META)
    assert "19.0 cudaFree and 19.0 cudaMalloc calls per step" in v.why and "unreliable" in v.why
    assert "batch=8" in v.levers[0]
    v = decide(headline(data_frac=0.62, data_ms=62.0), META)
    assert "62%" in v.why and "62.0 of 100.0 ms" in v.why and "workers=8" in v.levers[0]


def test_a_window_inside_the_loaders_prefetch_queue_is_flagged():
    # 15 workers x 2 batches = 30 batches can be ready before the first measured step
    meta = {**META, "workers": 15}
    v = decide(headline(utilization=0.91, steps_to_verdict_end=15), meta)
    assert v.name == COMPUTE and "Data wait may be understated" in v.why and "profile_warmup=30" in v.why
    v = decide(headline(utilization=0.4, steps_to_verdict_end=15), meta)
    assert v.name == HOST and "up to 30 batches ready (15 workers x 2)" in v.why
    # a window that ends after the queue had to drain, or in-process loading: no caveat
    assert "understated" not in decide(headline(utilization=0.91, steps_to_verdict_end=31), meta).why
    assert "understated" not in decide(headline(utilization=0.91, steps_to_verdict_end=5), {**META, "workers": 0}).why


def test_kernels_replayed_by_a_submodule_graph_are_counted_apart_in_their_phase():
    """cuda_graph=true with a plan of submodules (RT-DETR's backbone + encoder): the kernels launched inside a
    replay's host range ("captured <module> forward") are the phase's replayed GPU time; the rest ran eager."""
    trace = synthetic_trace(steps=2, kernels=4, kernel_us=100)
    for s in range(2):  # each step's first two kernel launches (at t+150, t+151) happen inside a replay
        trace["traceEvents"].append(X("user_annotation", "captured features forward", s * 1000.0 + 140, 11.5))
    t = slice_trace(trace)
    a = analyze_trace(t, steps=2, on_cuda=True)
    assert a["gpu_ms"]["forward"] == pytest.approx(0.4)
    assert a["replayed_gpu_ms"] == {"forward": pytest.approx(0.2)}
    plain = analyze_trace(slice_trace(synthetic_trace(steps=2)), steps=2, on_cuda=True)
    assert plain["replayed_gpu_ms"] == {}
