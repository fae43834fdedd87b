"""CPU proxies for the eager training step's host cost (no GPU needed).

    python benchmarks/host_overhead.py [--amp bf16|none] [--no-flat] [--batch 2] [--imgsz 32] [--windows 6] [--json]

The eager step on a GPU is host-bound: its time is what the host spends dispatching ops, not what the kernels
take. On a CPU with a tiny input (batch 2, 32 px) the compute is negligible too, so two figures track that cost:
- ATen ops dispatched per step and per phase (a TorchDispatchMode counter; views separately, as they launch no
  kernel), averaged over one accumulation window of 8 steps as `bench step` counts kernels;
- host milliseconds per step and per phase (median over windows, the counter off), in CPU time of the thread
  (time.thread_time: time the step spent running, not waiting for a core on a loaded machine), wall time beside.
`--micro` (the default for timing) narrows every layer to a few channels: the same layers and the same ops
in the same order (the op counts are identical), with CPU compute small enough that dispatch dominates; oneDNN
is switched off for it (its per-call set-up costs more than these convolutions). `--instructions` runs one window
inside a C call (qsort's comparison callback) for callgrind to count the machine
instructions of, the steadiest of these figures on a shared machine (two minutes to import torch under valgrind):

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*qsort*' --callgrind-out-file=/dev/null \
        $(python -c 'import sys; print(sys.executable)') benchmarks/host_overhead.py --instructions   # "Collected : N"

`--amp bf16` runs the step as on a GPU under float16 AMP: half-precision stand-ins (engine/flat.py), autocast
(bfloat16, the CPU's autocast dtype) and an enabled loss scaler. `--no-flat` is the DDP path (ordinary parameters)."""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from libreyolo.config import TrainConfig
from libreyolo.engine.amp import AmpPolicy
from libreyolo.engine.components import build_step_parts
from libreyolo.engine.flat import FlatParams
from libreyolo.families import parse_model_name

CPU = torch.device("cpu")
# ops whose result size or value the host must read: on a GPU each waits for the queued work (a synchronisation)
SYNC_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "is_nonzero",
    "equal",
    "masked_select",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "nonzero_static",
    "allclose",
}


class Phases:
    """A phases object (engine/step.py) that records which phase is running and how long each took."""

    def __init__(self) -> None:
        self.current = "other"
        self.ms: collections.Counter = collections.Counter()

    def __call__(self, name: str) -> Any:
        outer = self

        class _Ctx:
            def __enter__(self) -> None:
                self.prev, outer.current, self.t = outer.current, name, time.thread_time()

            def __exit__(self, *exc: Any) -> None:
                outer.ms[name] += (time.thread_time() - self.t) * 1000
                outer.current = self.prev

        return _Ctx()


class OpCounter(TorchDispatchMode):
    def __init__(self, phases: Phases) -> None:
        super().__init__()
        self.phases = phases
        self.ops: collections.Counter = collections.Counter()  # (phase, op name, is_view)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops[(self.phases.current, str(func.overloadpacket.__name__), bool(func.is_view))] += 1
        return func(*args, **(kwargs or {}))


MICRO = "micro"  # a YOLOv9 width table entry registered by --micro


def build(
    model: str,
    batch: int,
    imgsz: int,
    amp: str,
    flat: bool,
    acc: int,
    optimizer: str,
    seed: int = 0,
    micro: bool = False,
) -> tuple[Any, Any]:
    family, size = parse_model_name(model)
    if micro:
        from libreyolo.families.yolo9 import network

        network.SIZES[MICRO] = network.Widths(
            (4, 8), (8, 8, 4), (8, 8, 4), (8, 8, 4), (8, 8, 4), (8, 4), (8, 8), network.SIZES[size].n
        )
        size = MICRO
    cfg = TrainConfig.from_overrides(
        {"model": model, "imgsz": imgsz, "batch": batch, "nbs": batch * acc, "device": "cpu", "optimizer": optimizer}
    )
    torch.manual_seed(seed)
    net = family.build(size, 3)
    parts = build_step_parts(family, net, cfg, CPU, batch, 10_000_000, flat=False)
    if amp == "bf16":
        parts.amp = AmpPolicy(True, "bfloat16", True, "CPU stand-in for float16 AMP on a GPU")
        parts.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    if flat:
        parts.flat = FlatParams(parts.train_net, parts.amp.autocast_dtype, False)
    return parts, cfg


def batch_of(batch: int, imgsz: int, m: int = 4, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (batch, imgsz, imgsz, 3), dtype=torch.uint8, generator=g)
    xy = torch.rand(batch, m, 2, generator=g) * imgsz * 0.6
    wh = torch.rand(batch, m, 2, generator=g) * imgsz * 0.4 + 2
    cls = torch.randint(0, 3, (batch, m, 1), generator=g).float()
    targets = torch.cat((cls, xy, (xy + wh).clamp(max=imgsz)), -1)
    mask = torch.ones(batch, m, dtype=torch.bool)
    mask[:, -1] = False  # one padded slot per image
    return img, targets, mask


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    if args.micro:
        torch.backends.mkldnn.enabled = False
    parts, cfg = build(
        args.model, args.batch, args.imgsz, args.amp, not args.no_flat, args.acc, args.optimizer, micro=args.micro
    )
    step = parts.eager_step(cfg.grad_clip)
    img, targets, mask = batch_of(args.batch, args.imgsz)
    acc = parts.accumulate
    n = 0

    def window(ph: Phases) -> None:
        nonlocal n
        for _ in range(acc):
            n += 1
            step(img, targets, mask, n % acc == 0, ph)

    for _ in range(2):  # warm-up: optimizer state, caches
        window(Phases())
    if args.instructions:
        import ctypes

        cmp = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(lambda a, b: window(Phases()) or 0)
        pair = (ctypes.c_int * 2)(1, 2)
        ctypes.CDLL(None).qsort(pair, 2, ctypes.sizeof(ctypes.c_int), cmp)  # two elements: one comparison
        return {"config": vars(args), "accumulate": acc}
    ph = Phases()
    counter = OpCounter(ph)
    with counter:
        window(ph)
    per_phase: collections.Counter = collections.Counter()
    views: collections.Counter = collections.Counter()
    top: collections.Counter = collections.Counter()
    syncs = 0
    for (phase, name, is_view), k in counter.ops.items():
        (views if is_view else per_phase)[phase] += k
        if not is_view:
            top[f"{phase}:{name}"] += k
        if name in SYNC_OPS:
            syncs += k
    step_ms, wall_ms, phase_ms = [], [], collections.defaultdict(list)
    for _ in range(args.windows):
        ph = Phases()
        t, w = time.thread_time(), time.perf_counter()
        window(ph)
        step_ms.append((time.thread_time() - t) * 1000 / acc)
        wall_ms.append((time.perf_counter() - w) * 1000 / acc)
        for k, v in ph.ms.items():
            phase_ms[k].append(v / acc)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "ops_per_step": sum(per_phase.values()) / acc,
        "view_ops_per_step": sum(views.values()) / acc,
        "ops_per_phase": {k: v / acc for k, v in sorted(per_phase.items())},
        "view_ops_per_phase": {k: v / acc for k, v in sorted(views.items())},
        "host_reads_per_window": syncs,  # SYNC_OPS dispatched in one accumulation window
        "host_ms_per_step": statistics.median(step_ms),
        "host_ms_min": min(step_ms),
        "wall_ms_per_step": statistics.median(wall_ms),
        "host_ms_per_phase": {k: statistics.median(v) for k, v in sorted(phase_ms.items())},
        "top_ops": {k: v / acc for k, v in top.most_common(args.top)},
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="LibreYOLO9t")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--imgsz", type=int, default=32)
    p.add_argument("--acc", type=int, default=8, help="micro-steps per optimizer step (nbs = batch * acc)")
    p.add_argument("--amp", choices=("bf16", "none"), default="bf16")
    p.add_argument("--no-flat", action="store_true", help="ordinary parameters, as under DDP")
    p.add_argument("--optimizer", default="AdamW", choices=("AdamW", "SGD"))
    p.add_argument(
        "--micro", action=argparse.BooleanOptionalAction, default=True, help="narrow layers (same ops), oneDNN off"
    )
    p.add_argument("--windows", type=int, default=6, help="timed accumulation windows")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--instructions", action="store_true", help="one window inside qsort, for callgrind (see above)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = measure(args)
    if args.json or args.instructions:
        print(json.dumps(r))
        return 0
    print(
        f"ops/step {r['ops_per_step']:.0f} (+{r['view_ops_per_step']:.0f} views); host reads per window "
        f"{r['host_reads_per_window']}"
    )
    print("ops per phase: " + ", ".join(f"{k} {v:.0f}" for k, v in r["ops_per_phase"].items()))
    print(
        f"host CPU ms/step median {r['host_ms_per_step']:.2f} (min {r['host_ms_min']:.2f}, wall "
        f"{r['wall_ms_per_step']:.2f}); per phase: "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["host_ms_per_phase"].items())
    )
    for k, v in r["top_ops"].items():
        print(f"  {v:7.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
