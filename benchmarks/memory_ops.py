"""Which ops of the eager step issue the GPU's memory sets and copies (`bench step`'s `copies_per_step`).

    python benchmarks/memory_ops.py [KEY=VALUE ...]      # e.g. model=LibreYOLO9t batch=8 imgsz=640

Runs `bench step`'s eager runner (benchmarks/eager_split.py's EagerBench) for 24 micro-steps, then 8 under torch's
profiler, and puts each `cudaMemsetAsync` / `cudaMemcpyAsync` call under the innermost op that was running on its
thread. Prints the GPU's kernels, memory sets and copies per micro-step, then the calls per micro-step by op."""

from __future__ import annotations

import bisect
import collections
import json
import sys
import tempfile
from pathlib import Path

import torch
from eager_split import EagerBench  # this folder is on sys.path when run as a script

STEPS = 8


def main(overrides: list[str]) -> None:
    bench = EagerBench.build(overrides, model="LibreYOLO9t", batch="8", imgsz="640")
    bench.run(24)
    bench.sync()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if bench.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        bench.run(STEPS)
        bench.sync()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    ops: dict[int, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops[e["tid"]].append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]))
    starts = {}
    for tid, spans in ops.items():
        spans.sort()
        starts[tid] = [s for s, _, _ in spans]
    gpu = collections.Counter(e.get("cat") for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"))
    calls: collections.Counter[tuple[str, str | None]] = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "cuda_runtime" or not ("Memset" in name or "Memcpy" in name):
            continue
        t, spans = float(e["ts"]), ops.get(e["tid"], [])
        i, inner = bisect.bisect_right(starts.get(e["tid"], []), t) - 1, None
        while i >= 0:  # the latest-starting op that still runs at t is the innermost
            if spans[i][1] >= t:
                inner = spans[i][2]
                break
            i -= 1
        calls[(name, inner)] += 1
    print("per micro-step:", {k: v / STEPS for k, v in sorted(gpu.items())})
    for (name, op), n in calls.most_common(25):
        print(f"{n / STEPS:8.1f}  {name:20s} {op}")


if __name__ == "__main__":
    main(sys.argv[1:])
