"""What the training loop's host-to-device copy of each batch costs a whole-step graph (needs a CUDA GPU).

    python benchmarks/h2d_copy.py [model=LibreYOLO9t] [batch=16] [imgsz=640] [steps=48] [rounds=3]

The loop copies each batch from page-locked memory with `non_blocking=True` on the training stream (trainer.py),
so the copy runs in that stream's order: between one step's kernels and the next (19.7 MB of uint8 at batch 16,
640 px). Three ways of feeding the same replayed step, timed as throughput (wall time of `steps` steps queued back
to back, one synchronisation at the end), alternating over `rounds`:
- resident: the batch already on the device (what `bench step` times);
- copied: each step's batch copied from pinned memory on the training stream first (what training does now);
- prefetched: each step's batch copied on a side stream into one of two device buffers one step ahead, the training
  stream waiting for that copy's event (a copy engine overlapping the previous step's kernels).
Prints one JSON line: ms per step for each, the batch's bytes, and the copy's time alone."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from libreyolo.bench.step import _batch_on_device, make_runner
from libreyolo.cli.args import parse_kv
from libreyolo.config import TrainConfig


def main(argv: list[str]) -> int:
    kv = parse_kv(argv, extra={"steps": int, "rounds": int}, command="bench step")
    steps, rounds = int(kv.pop("steps", 48)), int(kv.pop("rounds", 3))
    if not torch.cuda.is_available():
        print("h2d_copy.py times CUDA copies and streams: it needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = TrainConfig.from_overrides({"model": "LibreYOLO9t", "batch": 16, "imgsz": 640, **kv})
    dev = torch.device("cuda", 0)
    data, nc = _batch_on_device(cfg, cfg.batch, dev)
    step, parts = make_runner(cfg, dev, nc, "full")
    acc, n = parts.accumulate, 0
    host = {k: v.cpu().pin_memory() for k, v in data.items()}
    side = torch.cuda.Stream(dev)
    cur = torch.cuda.current_stream(dev)
    buffers = [{k: torch.empty_like(v) for k, v in data.items()} for _ in range(2)]

    def one(batch: dict[str, torch.Tensor]) -> None:
        nonlocal n
        n += 1
        step(batch["img"], batch["targets"], batch["mask"], n % acc == 0)

    def resident() -> None:
        for _ in range(steps):
            one(data)

    def copied() -> None:
        for _ in range(steps):
            one({k: v.to(dev, non_blocking=True) for k, v in host.items()})

    def prefetched() -> None:
        copied_in: list[torch.cuda.Event | None] = [None, None]  # buffer j's copy has run
        read: list[torch.cuda.Event | None] = [None, None]  # the step that last read buffer j has run

        def fetch(j: int) -> None:
            with torch.cuda.stream(side):
                last_read = read[j]
                if last_read is not None:
                    side.wait_event(last_read)  # not over a batch a queued step still reads
                for k, v in host.items():
                    buffers[j][k].copy_(v, non_blocking=True)
                copied_in[j] = side.record_event()

        fetch(0)
        for i in range(steps):
            j = i % 2
            if i + 1 < steps:
                fetch(1 - j)  # the next batch's copy, beside this step
            ev = copied_in[j]
            assert ev is not None
            cur.wait_event(ev)
            one(buffers[j])
            read[j] = cur.record_event()

    ways = {"resident": resident, "copied": copied, "prefetched": prefetched}
    for fn in ways.values():  # warm-up: captures, first calls
        fn()
    torch.cuda.synchronize()
    ms: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ms[name].append((time.perf_counter() - t) * 1000 / steps)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for v in host.values():
        v.to(dev, non_blocking=True)
    b.record()
    b.synchronize()
    out = {
        "model": cfg.model,
        "batch": cfg.batch,
        "imgsz": cfg.imgsz,
        "steps": steps,
        "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "batch_bytes": sum(v.nbytes for v in host.values()),
        "copy_alone_ms": round(a.elapsed_time(b), 3),
        "ms_per_step": {k: [round(x, 2) for x in v] for k, v in ms.items()},
        "median_ms_per_step": {k: round(statistics.median(v), 2) for k, v in ms.items()},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
