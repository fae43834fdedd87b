"""libreyolo bench step: training-step time on one replayed real batch, eager vs cuda_graph=true vs "full".

Data loading is excluded: one augmented (mosaic) batch of the built-in dataset is moved to the device once
and replayed (a classifier's: a random-resized-crop batch of the built-in shapes crops). Each mode gets a fresh
network (same seed) in the same process, warms up (graph modes capture
during it), then at least 24 steps, in whole accumulation cycles, are timed one by one with CUDA events. Gradient
accumulation runs as in training (an optimizer step every nbs/batch steps), so the figures are per training step.
Modes are compared by the timed steps back to back (mean_ms): most steps of a cycle are micro-steps, whose median
leaves out the optimizer, and an overlapped eager micro-step leaves part of its backward to the next one."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from libreyolo import oom
from libreyolo.cli.args import flag, parse_kv
from libreyolo.config import TrainConfig
from libreyolo.errors import ConfigError

MODES = {
    "eager": False,
    "graph": True,
    "full": "full",
    "compile": False,
    "compile-net": False,
}  # torch.compile experiments (bench only)
KEYS = {
    "model",
    "data",
    "batch",
    "imgsz",
    "device",
    "amp",
    "amp_dtype",
    "nbs",
    "channels_last",
    "seed",
    "aux",
    "optimizer",
    "cudnn_benchmark",
    "overlap_backward",
}
# this benchmark's defaults where they differ from TrainConfig's: --help shows these, run() applies them
DEFAULTS: dict[str, object] = {"batch": 8, "imgsz": 640}


def _batch_on_device(cfg: TrainConfig, batch: int, device: torch.device) -> tuple[dict[str, torch.Tensor], int]:
    from libreyolo.data.dataset import AugmentConfig, collate
    from libreyolo.families import parse_model_name
    from libreyolo.tasks import get_task

    parsed = parse_model_name(cfg.model)
    task = get_task(parsed[0].task if parsed is not None else "detect").implementation()
    dc = task.load_data(cfg.data)  # "shapes": the task's built-in set (a classifier's: the shapes crops)
    ds = task.dataset(task.scan(dc, "train", [], True), cfg.imgsz, True, AugmentConfig.from_config(cfg), cfg.seed)
    b = collate([ds[(i, 0, True)] for i in range(batch)])
    return {k: b[k].to(device) for k in ("img", "targets", "mask")}, dc.nc


def pad_targets(data: dict[str, torch.Tensor], slots: int) -> dict[str, torch.Tensor]:
    """The batch with its targets padded to `slots` per image (empty slots masked out), as a training batch is padded
    to a whole-step graph's capacity: the assigner works on every slot, so its cost follows the capacity."""
    extra = slots - data["targets"].shape[1]
    if extra < 0:
        raise ConfigError(f"capacity={slots}: the benchmark's batch has {data['targets'].shape[1]} target slots")
    pad = torch.nn.functional.pad
    return {**data, "targets": pad(data["targets"], (0, 0, 0, extra)), "mask": pad(data["mask"], (0, extra))}


def make_runner(
    cfg: TrainConfig,
    device: torch.device,
    nc: int,
    mode: str,
    emit: Any = None,
    ddp: Any = None,
    capacity: int | None = None,
) -> tuple[Any, Any]:
    """A fresh network (seeded) and the step runner for `mode` (eager | graph | full | compile | compile-net)
    -> (runner, StepParts). ddp: a DistContext over NCCL; the step then averages its flat gradients with one
    all-reduce as a DDP run with CUDA graphs does (captured inside the graph in the full mode). capacity: the full
    step's target slots per image, as a training run's setup gives it from the labels (None: raised as batches need).

    compile is an experiment for the benchmark, not a training option: the eager step with its forward (network
    under autocast) and its loss wrapped in torch.compile (default mode, static shapes); the optimizer and the EMA
    stay eager. compile-net compiles the forward only."""
    from libreyolo.engine.components import build_step_parts, overlap_wanted
    from libreyolo.engine.runners import select_step
    from libreyolo.families import parse_model_name

    family, size = parse_model_name(cfg.model)
    torch.manual_seed(cfg.seed)
    cfg.cuda_graph = MODES[mode]
    net = family.build(size, nc)
    parts = build_step_parts(family, net, cfg, device, cfg.batch, 10_000_000)
    eager = parts.eager_step(cfg.grad_clip)
    if ddp is not None:
        eager.grad_reduce = ddp.grad_reducer()
    if mode == "eager":  # as a training run with this batch and accumulation runs it
        eager.overlap_backward = overlap_wanted(cfg, eager, device, parts.accumulate, cfg.batch == -1)
    if mode.startswith("compile"):
        eager.forward = torch.compile(eager.forward, dynamic=False)
        if mode == "compile":
            eager.loss_fn = torch.compile(eager.loss_fn, dynamic=False)
        return eager, parts
    world, backend, nccl = (ddp.world_size, ddp.backend, ddp.nccl_version()) if ddp is not None else (1, None, None)
    emit = emit or (lambda e: None)
    runner = select_step(eager, parts, cfg, family, device, world, emit, backend, nccl, capacity)[0]
    return runner, parts


def bench_mode(
    mode: str,
    cfg: TrainConfig,
    device: torch.device,
    data: dict,
    nc: int,
    steps: int,
    warmup: int,
    kernels: bool,
    ddp: Any = None,
    capacity: int | None = None,
) -> dict[str, Any]:
    notes: list[str] = []
    step, parts = make_runner(cfg, device, nc, mode, lambda e: notes.append(f"{e.action}: {e.reason}"), ddp, capacity)
    acc = parts.accumulate
    # whole accumulation cycles: an optimizer step's share is then counted once per step, and an overlapped eager
    # backward (engine/overlap.py), which ends inside the next micro-step, is timed where it runs
    steps = -(-steps // acc) * acc
    n = 0

    def run(k: int, phases: Any = None) -> None:
        nonlocal n
        for _ in range(k):
            n += 1
            items = step(  # noqa: F821  (step is deleted only after the last call)
                data["img"], data["targets"], data["mask"], n % acc == 0, **({"phases": phases} if phases else {})
            )
            del items

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    run(warmup)
    if cuda:
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0  # includes graph capture or compilation
    # a plan of submodules (a DETR's backbone + encoder): time their graph replays, the captured share of the step
    parts_graphs = getattr(step, "parts", None) if cuda else None
    if parts_graphs is not None:
        parts_graphs.timings = []
    # an eager step's overlapped backward (engine/overlap.py) ends inside the back-to-back window
    times, mean_ms = timed_steps(lambda: run(1), steps, cuda, step.sync)
    out: dict[str, Any] = {
        "mode": f"{mode} ddp" if ddp is not None else mode,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "mean_ms": mean_ms,
        "overlap_backward": bool(getattr(step, "overlap_backward", False)),
        "steps": steps,
        "accumulate": acc,
        "warmup_s": warmup_s,
        "peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "peak_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30 if cuda else None,
        "notes": notes,
        "captured_ms": None,
        "captured_share": None,
    }
    if parts_graphs is not None:
        spans = parts_graphs.timings or []
        parts_graphs.timings = None
        captured = sum(a.elapsed_time(b) for a, b in spans) / steps
        out["captured_ms"] = captured
        out["captured_share"] = captured / statistics.mean(times)
    if kernels:
        from libreyolo.bench.kernels import count_kernels

        window = acc  # one accumulation window: acc-1 micro steps and one optimizer step
        # the busy fraction is of the profiled window's own wall time (bench/kernels.py): the profiler slows a
        # host-bound step, so dividing by median_ms (timed without it) overstated it, up to 1.77
        out.update(count_kernels(lambda ph: run(window, ph), window, cuda))
    del step, parts
    if cuda:
        torch.cuda.empty_cache()
    return out


def timed_steps(
    one_step: Callable[[], None], steps: int, cuda: bool, finish: Callable[[], None] = lambda: None
) -> tuple[list[float], float]:
    """-> (each step's ms: between two CUDA events, synchronised after it; on a CPU its wall time, mean ms of the
    steps back to back). The back-to-back figure includes the last step's work and finish() (work a step leaves
    running, such as an overlapped backward), where the median of single steps may not show it."""
    times = []
    t_window = time.perf_counter()
    for _ in range(steps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            one_step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            one_step()
            times.append((time.perf_counter() - t) * 1000)
    finish()
    if cuda:
        torch.cuda.synchronize()
    return times, (time.perf_counter() - t_window) * 1000 / steps


def bench_device(cfg: TrainConfig) -> tuple[torch.device, bool]:
    """The benchmark's device, made current, and cuDNN's algorithm timing set as training sets it for a run long
    enough that auto turns it on (a step as in a long run) -> (device, cudnn_benchmark)."""
    from libreyolo.distributed.device import first_device
    from libreyolo.engine.state import CUDNN_BENCHMARK_MIN_STEPS, cudnn_benchmark_for

    device = first_device(cfg.device)
    cudnn_benchmark = cudnn_benchmark_for(cfg.cudnn_benchmark, cfg.deterministic, CUDNN_BENCHMARK_MIN_STEPS)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = cudnn_benchmark
    return device, cudnn_benchmark


def _single_rank_group(device_spec: str) -> Any:
    """This process as rank 0 of a one-process NCCL group, as torchrun --nproc_per_node=1 would start it."""
    import os

    from libreyolo.distributed import context
    from libreyolo.launch import free_port

    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )
    _, ctx = context.start(device_spec)
    if ctx.backend != "nccl":
        raise ConfigError(f"ddp=true needs a CUDA device with NCCL (got the {ctx.backend} backend)")
    return ctx


def run(argv: list[str]) -> int:
    extra = {"modes": str, "steps": int, "warmup": int, "json": flag, "kernels": flag, "ddp": flag, "capacity": int}
    if any(a in ("-h", "--help") for a in argv):
        from libreyolo.cli.help import show_help

        return show_help(
            "bench step",
            KEYS,
            {
                "modes": "comma list of eager, graph, full, compile, compile-net (default: eager, graph, full; "
                "compile*: the eager step under torch.compile, an experiment)",
                "steps": "timed steps (>= 24)",
                "warmup": "untimed steps first (default 16)",
                "kernels": "count kernels per step and phase (default true)",
                "ddp": "also run the graph modes as one DDP rank over NCCL (world size 1): the flat-gradient "
                "all-reduce in the step, captured in the full mode (default false)",
                "capacity": "pad the batch's targets to this many slots per image, and give the full mode's graph that "
                "capacity, as a training run's label scan does (default: the batch's own)",
                "json": "print JSON",
            },
            DEFAULTS,
        )
    kw = parse_kv(argv, KEYS, extra)
    modes = [m.strip() for m in kw.pop("modes", "eager,graph,full").split(",")]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ConfigError(f"modes={bad[0]!r}: choose from {', '.join(MODES)}")
    steps, warmup = max(kw.pop("steps", 24), 24), kw.pop("warmup", 16)
    as_json, kernels, ddp = kw.pop("json", False), kw.pop("kernels", True), kw.pop("ddp", False)
    slots = kw.pop("capacity", None)
    cfg = TrainConfig.from_overrides({**DEFAULTS, **kw})
    results, meta = measure(cfg, modes, steps, warmup, kernels, ddp, slots)
    if as_json:
        print(json.dumps({"meta": meta, "results": results}))
        return 0
    from libreyolo.bench.tables import print_step_table

    print_step_table(meta, results)
    return 0


def measure(
    cfg: TrainConfig, modes: list[str], steps: int, warmup: int, kernels: bool, ddp: bool, slots: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every mode on the same replayed batch (and, with ddp, the graph modes again as one DDP rank) -> (one result
    per mode with its speed-up against eager, the run's meta)."""
    spec = oom.RunSpec(
        "benchmarking the training step of", cfg.model, cfg.batch, cfg.imgsz, cfg.device, flags=oom.NO_AUTOBATCH
    )
    with oom.explained(lambda: spec):
        device, cudnn_benchmark = bench_device(cfg)
        data, nc = _batch_on_device(cfg, cfg.batch, device)
        if slots:
            data = pad_targets(data, slots)
        ctx = _single_rank_group(cfg.device) if ddp else None  # before any work: a CPU run cannot have it
        results = [bench_mode(m, cfg, device, data, nc, steps, warmup, kernels, capacity=slots) for m in modes]
        if ctx is not None:
            results += [
                bench_mode(m, cfg, device, data, nc, steps, warmup, kernels, ctx, slots)
                for m in modes
                if m in ("graph", "full")
            ]
            ctx.finish()
            ctx.close()
    # compared by the mean of the steps back to back over whole accumulation cycles: a median is a micro-step's
    # where most steps are micro-steps, and an overlapped eager micro-step leaves part of its backward to the next
    base = next((r["mean_ms"] for r in results if r["mode"] == "eager"), None)
    plain = {r["mode"]: r["mean_ms"] for r in results}
    for r in results:
        r["speedup_vs_eager"] = base / r["mean_ms"] if base else None
        if r["mode"].endswith(" ddp"):  # what the all-reduce (and the DDP bookkeeping) adds to the same step
            r["ddp_overhead"] = r["mean_ms"] / plain[r["mode"].removesuffix(" ddp")] - 1.0
    from libreyolo.amp import resolve_amp

    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)  # what the steps ran in (on a CPU: float32, whatever amp says)
    meta = {
        "model": cfg.model,
        "batch": cfg.batch,
        "imgsz": cfg.imgsz,
        "amp": amp.enabled,
        "amp_dtype": amp.dtype,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "targets_capacity": int(data["targets"].shape[1]),
        "objects": int(data["mask"].sum()),
        "data": cfg.data,
        "cudnn_benchmark": cudnn_benchmark,
        "date": time.strftime("%Y-%m-%d"),
    }
    return results, meta
