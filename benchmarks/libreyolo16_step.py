"""LibreYOLO 1.6's training step, timed the way `libreyolo bench step` times ours, on the same batch.

    pip install --no-deps --target /tmp/ly16 libreyolo==1.6.0 tqdm     # or LIBREYOLO16_DIR, as tests/test_weights16
    python benchmarks/libreyolo16_step.py --ly16 /tmp/ly16 --size t --batch 8 --imgsz 640 --modes eager,graph
    python benchmarks/libreyolo16_step.py --ly16 /tmp/ly16 --family dfine --size s --batch 8 --imgsz 640
    python benchmarks/libreyolo16_step.py --ly16 /tmp/ly16 --family yolo9 --size t --batch 32 --imgsz 640

Families and sizes (those both have): rtmdet t s m l x (the default), dfine n s m, yolo9 t s m c, yolox n t s m l x,
rtdetr r18 r34 r50 r101. Issue 52 asked for RTMDet-t's whole captured step beside 1.6's own step for the same model,
issue 49 for a row per size of each family, each measured in one call. 1.6 is also named `libreyolo`, so it cannot be
imported beside this project: this script makes `bench step`'s batch (the built-in shapes dataset, same seed, this
project's augmentation for the family: mosaic where ours has it, none for the DETRs) with this project, saves it
with the nbs that `bench step` resolves for our model, and runs itself again in a child process with only 1.6 on the
path (--ly16, plus --deps for tqdm where it lies apart), which times 1.6's step and prints one JSON line per mode.

What runs per step, family by family, and what is left out in 1.6's favour (the data loader, the per-step loss
logging and its synchronisations, the LR schedule's update): benchmarks/libreyolo16_families.py's docstring, below.
`eager`: 1.6's plain step. `graph`: 1.6's `cuda_graph=True` (every family here has a capture spec: its
TrainGraphManager captures the network, or a DETR's backbone and encoder, while the loss runs eagerly); 1.6 starts
no graph manager on a CPU, so there a graph line says it was skipped.

Timing as `bench step`: each step between two CUDA events with a synchronisation after it (median, min), and the
timed steps back to back (mean). Each JSON line names the model (family and size), mode, batch, imgsz, accumulate,
the figures and the parameter count (`params`; with YOLOv9's PGI branch, which ours keeps out of saved weights too),
on CUDA the peak allocated memory; a trainer family's line adds nbs, amp, optimizer, lr0, weight_decay,
clip_max_norm and ema_decay."""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libreyolo16_families as families  # beside this script: on the path of both processes as the script's folder
import torch

BENCH_STEP_TRAIN_IMAGES = 10_000_000  # the training-set size `bench step` gives build_step_parts: a long run


def parent(a: argparse.Namespace) -> None:
    """Make bench step's batch with this project, then time 1.6 on it in a child process."""
    from libreyolo.bench.step import _batch_on_device
    from libreyolo.config import TrainConfig
    from libreyolo.engine.components import resolve_nbs

    cfg = TrainConfig.from_overrides(
        {"model": f"{families.FAMILIES[a.family].prefix}{a.size}", "batch": a.batch, "imgsz": a.imgsz}
    )
    data, nc = _batch_on_device(cfg, a.batch, torch.device("cpu"))
    # our model's nbs as `bench step` resolves it (auto: 64; D-FINE 32, RT-DETR 16), which 1.6 accumulates to
    nbs = a.nbs if a.nbs is not None else resolve_nbs(cfg.nbs, a.batch, BENCH_STEP_TRAIN_IMAGES, cfg.epochs)
    with tempfile.TemporaryDirectory() as tmp:
        batch = Path(tmp) / "batch.pt"
        rec = {"img": data["img"], "targets": data["targets"], "mask": data["mask"], "nc": nc, "nbs": nbs}
        torch.save(rec, batch)
        path = os.pathsep.join(os.path.abspath(p) for p in (a.ly16, a.deps) if p)  # the child runs in tmp
        env = {**os.environ, "PYTHONPATH": path}
        argv = [sys.executable, __file__, "--child", str(batch), *sys.argv[1:]]
        rc = subprocess.run(argv, env=env, cwd=tmp).returncode
    if rc:
        raise SystemExit(rc)


def child(a: argparse.Namespace) -> None:
    import libreyolo

    if not hasattr(libreyolo, "LibreRTMDet"):
        raise SystemExit(f"expected LibreYOLO 1.6 on PYTHONPATH, imported {libreyolo.__file__}")
    rec = torch.load(a.child, weights_only=True)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.init()  # the allocator's per-device state exists only after CUDA's lazy start: its stats need it
    for mode in a.modes.split(","):
        row = {
            "libreyolo": getattr(libreyolo, "__version__", "1.6"),
            "model": f"{families.FAMILIES[a.family].tag}-{a.size}",
            "mode": mode,
            "batch": a.batch,
            "imgsz": a.imgsz,
        }
        if mode == "graph" and not cuda:  # BaseTrainer._start_cuda_graph_manager: "device is not CUDA"
            print(json.dumps({**row, "skipped": "1.6's cuda_graph=True needs CUDA (it trains eagerly)"}), flush=True)
            continue
        torch.manual_seed(0)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        run = families.build(a.family, a, rec, device, mode)
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            run.step()
        if cuda:
            torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t0
        steps = -(-a.steps // run.accumulate) * run.accumulate  # whole accumulation cycles, as bench step times
        times, mean_ms = _timed(run.step, steps, cuda)
        row |= {
            "captured": bool(run.manager is not None and run.manager.captured),
            "accumulate": run.accumulate,
            "steps": steps,
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "mean_ms": mean_ms,
            "warmup_s": warmup_s,
            "peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
            **run.extra,
        }
        print(json.dumps(row), flush=True)
        del run  # the next mode builds its own network, optimizer and graphs (the trainer and its spec: a cycle)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def _timed(step, steps: int, cuda: bool) -> tuple[list[float], float]:
    """libreyolo.bench.step.timed_steps, repeated here: the child cannot import this project."""
    times, t_window = [], time.perf_counter()
    for _ in range(steps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1000)
    if cuda:
        torch.cuda.synchronize()
    return times, (time.perf_counter() - t_window) * 1000 / steps


def main() -> None:
    ap = argparse.ArgumentParser(
        description=f"{__doc__}\n\n{families.__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--ly16", default=os.environ.get("LIBREYOLO16_DIR", ""), help="folder LibreYOLO 1.6 is installed in"
    )
    ap.add_argument("--deps", default=os.environ.get("LIBREYOLO16_DEPS", ""), help="more folders for the child (tqdm)")
    ap.add_argument("--family", default="rtmdet", choices=tuple(families.FAMILIES))
    ap.add_argument("--size", help="default: t for rtmdet and yolo9, s for dfine, n for yolox, r18 for rtdetr")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument(
        "--nbs",
        type=int,
        default=None,
        help="accumulate round(nbs / batch) (default: our model's, as bench step; 0: none)",
    )
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    fam = families.FAMILIES[a.family]
    a.size = a.size or fam.default
    if a.size not in fam.sizes:
        raise SystemExit(f"--family {a.family} has sizes {', '.join(fam.sizes)} here, not {a.size!r}")
    bad = [m for m in a.modes.split(",") if m not in ("eager", "graph")]
    if bad:
        raise SystemExit(f"unknown mode {bad[0]!r}: eager or graph")
    if a.child:
        child(a)
    elif not a.ly16:
        raise SystemExit("name LibreYOLO 1.6's folder: --ly16 DIR or LIBREYOLO16_DIR")
    else:
        parent(a)


if __name__ == "__main__":
    main()
