"""The overlapped eager step with its backward's graph kept to the end or freed as it goes, in one process.

    python benchmarks/overlap_free.py -- model=LibreYOLO9t batch=8 imgsz=640 [nbs=64] [device=cpu]

engine/overlap.py runs a micro-step's backward beside the next forward, on a helper thread, and autograd frees that
backward's graph node by node as it goes; each saved activation that was once a Python object needs the interpreter
lock to go, which the loop's thread holds while it runs the next forward. This compares, in one process on one batch
(`bench step`'s), blocks of two accumulation windows run three ways, in turn:
- keep: the overlapped backward keeps its graph to the end (retain_graph=True), freed in one go when the helper
  lets go of it;
- free: the library's step (autograd's default);
- free+switch: as free, with the interpreter's switch interval at 0.5 ms instead of 5 ms (if free waits for the
  interpreter lock, this waits less).
Alternating blocks inside one process leave out what differs between processes (cuDNN's choices, the machine's
state), which on the H200 moved `bench step`'s eager median by 20-30 ms between runs of the same code. Prints one
JSON line: per variant, the per-step time of each block (the block's wall time, backward included, over its steps)
and their median, and the peak memory each variant reached."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch


def main(argv: list[str]) -> None:
    from libreyolo.bench.step import DEFAULTS, _batch_on_device, bench_device, make_runner
    from libreyolo.config import TrainConfig
    from libreyolo.engine import step as step_module

    keep = {"on": True}
    library_backward = step_module.EagerStep._backward

    class Kept:
        """The loss as the library's _backward sees it, its backward keeping the graph."""

        def __init__(self, loss: torch.Tensor) -> None:
            self.loss = loss

        def backward(self) -> None:
            self.loss.backward(retain_graph=True)

    def backward(self: step_module.EagerStep, loss: torch.Tensor) -> None:
        # the graph kept to the end only on the overlap's helper thread
        on_helper = threading.current_thread().name == "libreyolo-backward"
        library_backward(self, Kept(loss) if keep["on"] and on_helper else loss)  # type: ignore[arg-type]

    step_module.EagerStep._backward = backward  # type: ignore[method-assign]
    cfg = TrainConfig.from_overrides({**DEFAULTS, **dict(a.split("=", 1) for a in argv)})
    device, _ = bench_device(cfg)
    data, nc = _batch_on_device(cfg, cfg.batch, device)
    step, parts = make_runner(cfg, device, nc, "eager")
    step.overlap_backward = True  # as the rule sets it on a GPU; forced so the script also runs on a CPU
    cuda = device.type == "cuda"
    acc = parts.accumulate
    assert acc > 1, "needs micro-steps to overlap: nbs above batch"
    n = 0

    def block(windows: int) -> float:
        nonlocal n
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(windows * acc):
            n += 1
            step(data["img"], data["targets"], data["mask"], n % acc == 0)
        step.sync()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1000 / (windows * acc)

    variants = {"keep": (True, 0.005), "free": (False, 0.005), "free+switch": (False, 0.0005)}
    block(2)  # warm-up
    times: dict[str, list[float]] = {v: [] for v in variants}
    peaks: dict[str, float] = {}
    for _ in range(8):
        for name, (retain, interval) in variants.items():
            keep["on"] = retain
            sys.setswitchinterval(interval)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            times[name].append(block(2))
            if cuda:
                peaks[name] = max(peaks.get(name, 0.0), torch.cuda.max_memory_allocated(device) / 2**30)
    sys.setswitchinterval(0.005)
    out = {
        "model": cfg.model,
        "batch": cfg.batch,
        "imgsz": cfg.imgsz,
        "accumulate": acc,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "ms_per_step_median": {k: statistics.median(v) for k, v in times.items()},
        "ms_per_step_blocks": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "peak_allocated_gb": peaks or None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "--":
        sys.exit(__doc__)
    main(sys.argv[2:])
