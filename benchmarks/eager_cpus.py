"""The overlapped eager step by where its two busy threads run: the loop's thread (forward, loss) and autograd's
device thread (the backward beside the next forward), each pinned to a CPU or left to the scheduler.

    python benchmarks/eager_cpus.py [--rounds 4] [--steps 48] -- model=LibreYOLO9t batch=8 imgsz=640

An experiment (needs a CUDA GPU). Overlapped, each thread is busy ~50 ms of CPU per micro-step, but a micro-step
takes 75-80 ms and the forward's CPU time grows by 10-24 ms beside the backward (docs/performance.md,
benchmarks/eager_split.py): is that two threads sharing a physical core (SMT siblings) or its caches? Placements,
alternating in one process on one runner (BatchNorm on cuDNN or, with `+bn`, on PyTorch's kernels:
benchmarks/conv_paths.py):
- free: no pinning (the library);
- cores: the two threads on CPUs of two different cores;
- siblings: on two hardware threads of one core (where the machine has SMT);
- one: both on one CPU;
- serial: no pinning, the backward in the loop (not beside the next forward);
- keep: no pinning, overlapped, the backward keeps its graph (retain_graph): the saved activations, once Python
  objects, are then freed in one go after it instead of one by one by autograd's thread, which takes the
  interpreter lock for each;
- streams: no pinning, overlapped, consecutive micro-steps inside an accumulation window on two side streams in
  turn, so that a backward (on its forward's stream) and the next forward launch onto different streams (the
  CUDA driver's internal locks are the largest lock wait of both threads). Ordered on the GPU: a micro-step's
  stream waits for the main one (its inputs, the weights), each backward's for the previous backward's, the
  window's last micro-step (on the main stream) for both.
Prints the CPU topology, one JSON line per placement and round (ms per micro-step back to back, and per micro-step
each thread's CPU ms and its voluntary / involuntary context switches), then medians."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections import defaultdict
from typing import Any

import torch
from conv_paths import conv_forward, set_variant  # this folder is on sys.path when run as a script
from eager_split import EagerBench, thread_cpu, thread_files


def siblings() -> list[list[int]]:
    """Hardware threads grouped by core, from sysfs."""
    groups: dict[str, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                key = f.read().strip()
        except OSError:
            key = str(cpu)
        groups.setdefault(key, []).append(cpu)
    return list(groups.values())


def tids(name: str) -> list[int]:
    return [tid for tid, comm, _ in thread_files("comm") if comm == name]


def thread_switches() -> dict[str, list[int]]:
    """Voluntary and involuntary context switches of every OS thread, summed by thread name."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for _, name, status in thread_files("status"):
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                out[name][0] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                out[name][1] += int(line.split()[1])
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--variants", default="free,one,serial,keep,streams")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    from libreyolo.nn import blocks

    blocks.Conv.forward = conv_forward  # type: ignore[method-assign]
    b = EagerBench.build(a.overrides)
    device, step, acc = b.device, b.step, b.parts.accumulate
    step.overlap_backward = acc > 1
    groups = siblings()
    everything = set(os.sched_getaffinity(0))
    smt = [g for g in groups if len(g) > 1]
    print(json.dumps({"cores": len(groups), "cpus": len(everything), "sibling_groups": groups[:4]}), flush=True)
    loop_tid = threading.get_native_id()
    b.run(2 * acc)
    b.sync()
    autograd = tids("pt_autograd_0")
    if not autograd:
        raise SystemExit("no pt_autograd_0 thread: is the backward overlapped?")
    places: dict[str, tuple[set[int], set[int]] | None] = {
        "free": None,
        "cores": ({groups[1][0]}, {groups[2][0]}),
        "one": ({groups[1][0]}, {groups[1][0]}),
        "serial": None,
        "keep": None,
        "streams": None,
    }
    backward = type(step)._backward
    E = type(step)
    P = type(step._pending)
    plain_call, plain_wait = E.__call__, P.wait
    sides = [torch.cuda.Stream(device), torch.cuda.Stream(device)] if device.type == "cuda" else []
    turn = [0]

    def streams_wait(self: Any) -> None:
        plain_wait(self)
        cur = torch.cuda.current_stream(device)
        for side in sides:  # the previous backward's work, all queued now that its thread has ended
            if side != cur:
                cur.wait_stream(side)

    def streams_call(self: Any, img: Any, targets: Any, mask: Any, boundary: bool, *args: Any) -> Any:
        if boundary:
            return plain_call(self, img, targets, mask, boundary, *args)
        turn[0] += 1
        side = sides[turn[0] % 2]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            return plain_call(self, img, targets, mask, boundary, *args)

    def keep_backward(self: Any, scaled_loss: torch.Tensor) -> None:
        scaled_loss.backward(retain_graph=True)
        if self.flat is not None:
            self.flat.gather_grads()

    if smt:
        places["siblings"] = ({smt[1][0]}, {smt[1][1]})
    variants = [v for v in a.variants.split(",") if v.split("+")[0] in places]
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(a.rounds):
        for v in variants:
            place = places[v.split("+")[0]]
            set_variant("bn" if v.endswith("+bn") else "base")
            step.overlap_backward = acc > 1 and not v.startswith("serial")
            type(step)._backward = keep_backward if v.startswith("keep") else backward
            E.__call__ = streams_call if v.startswith("streams") else plain_call  # type: ignore[method-assign]
            P.wait = streams_wait if v.startswith("streams") else plain_wait  # type: ignore[method-assign]
            loop_cpus, grad_cpus = place if place is not None else (everything, everything)
            os.sched_setaffinity(loop_tid, loop_cpus)
            for t in autograd:
                os.sched_setaffinity(t, grad_cpus)
            b.run(acc)
            b.sync()
            c0, s0 = thread_cpu(), thread_switches()
            t0 = time.perf_counter()
            b.run(a.steps)
            b.sync()
            ms = (time.perf_counter() - t0) * 1000 / a.steps
            c1, s1 = thread_cpu(), thread_switches()
            names = ("python3", "python", "pt_autograd_0")
            cpu = {k: round((c1[k] - c0.get(k, 0.0)) * 1000 / a.steps, 1) for k in names if k in c1}
            sw = {k: [round((s1[k][i] - s0.get(k, [0, 0])[i]) / a.steps, 1) for i in (0, 1)] for k in names if k in s1}
            row: dict[str, Any] = {"variant": v, "round": r, "step_ms": round(ms, 2), "cpu_ms": cpu, "switches": sw}
            rows[v]["step_ms"].append(ms)
            print(json.dumps(row), flush=True)
    os.sched_setaffinity(loop_tid, everything)
    print(json.dumps({"medians": {v: round(statistics.median(d["step_ms"]), 2) for v, d in rows.items()}}))


if __name__ == "__main__":
    main()
