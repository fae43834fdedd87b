"""What a process's first forward and backward cost on the GPU, and whether a thread can take part of it.

    python benchmarks/first_pass.py plain|lib|thread|copy|copythread|profile [--model LibreYOLO9t] [--batch 16]
        [--imgsz 640] [--warm-batch N]

Run each mode in a fresh process. plain: import torch, create the CUDA context, then three forward+backward passes
of the model (float16 autocast, channels_last). lib: first a tiny convolution and matrix product (cuDNN and cuBLAS
loaded) in the main thread. thread: the same tiny warm-up in a second thread while the main thread counts in a
Python loop, which shows how much interpreter time the warm-up leaves it. copy: first one forward+backward of a
copy of the model at --warm-batch images (default --batch) in the main thread; copythread: the same in a second
thread while the main thread makes two more copies of the model (the setup's EMA and validation copies), timed.
profile: the first and the second pass under torch.profiler, the ops and CUDA calls with the most CPU time in
each. Prints one JSON line of seconds."""

from __future__ import annotations

import argparse
import copy
import json
import threading
import time

t_start = time.perf_counter()
import torch  # noqa: E402  (timed)

IMPORT_S = time.perf_counter() - t_start


def library_warmup() -> None:
    """cuDNN and cuBLAS on zeros (no random numbers drawn)."""
    x = torch.zeros(2, 16, 64, 64, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.zeros(16, 16, 3, 3, device="cuda", dtype=torch.float16, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    (y.float().sum() + (x.flatten(1) @ x.flatten(1).t()).float().sum()).backward()
    torch.cuda.synchronize()


def model_pass(net: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.autocast("cuda", dtype=torch.float16):
        out = net(x)
    tensors: list[torch.Tensor] = []

    def walk(o: object) -> None:
        if isinstance(o, torch.Tensor):
            tensors.append(o)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)

    walk(out)
    torch.stack([t.float().mean() for t in tensors]).sum().backward()
    torch.cuda.synchronize()


def profile_passes(net: torch.nn.Module, x: torch.Tensor) -> dict[str, object]:
    """The first and second passes under torch.profiler (CPU ops and CUDA API calls): total and top self CPU."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts):  # the profiler's own start-up, outside the passes
        torch.zeros(1, device="cuda").add_(1)
    out: dict[str, object] = {}
    for i in (1, 2):
        t = time.perf_counter()
        with profile(activities=acts) as prof:
            model_pass(net, x)
        out[f"profiled_pass_{i}_s"] = round(time.perf_counter() - t, 3)
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:14]
        out[f"profiled_pass_{i}_top_self_cpu_ms"] = [
            [e.key, e.count, round(e.self_cpu_time_total / 1000, 1)] for e in rows
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plain", "lib", "thread", "copy", "copythread", "profile"])
    ap.add_argument("--model", default="LibreYOLO9t")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--warm-batch", type=int, default=None)
    a = ap.parse_args()
    res: dict[str, object] = {"mode": a.mode, "import_torch_s": round(IMPORT_S, 2)}
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["cuda_context_s"] = round(time.perf_counter() - t, 2)
    if a.mode == "lib":
        t = time.perf_counter()
        library_warmup()
        res["library_warmup_s"] = round(time.perf_counter() - t, 2)
    elif a.mode == "thread":
        th = threading.Thread(target=library_warmup)
        t, n = time.perf_counter(), 0
        th.start()
        while th.is_alive():
            n += 1
        res["library_warmup_in_thread_s"] = round(time.perf_counter() - t, 2)
        beside = n / (time.perf_counter() - t)
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < 0.5:
            n += 1
        res["main_loop_speed_beside_it"] = round(beside / (n / 0.5), 2)  # 1.0: the warm-up took no interpreter time
    from libreyolo import LibreYOLO

    net = LibreYOLO(a.model).net.cuda().to(memory_format=torch.channels_last).train()
    x = torch.zeros(a.batch, 3, a.imgsz, a.imgsz, device="cuda").to(memory_format=torch.channels_last)
    if a.mode in ("copy", "copythread"):
        warm_x = x[: a.warm_batch] if a.warm_batch else x
        t = time.perf_counter()
        warm = copy.deepcopy(net)
        res["warm_copy_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        if a.mode == "copy":
            model_pass(warm, warm_x)
        else:
            th = threading.Thread(target=model_pass, args=(warm, warm_x))
            th.start()
            tc = time.perf_counter()
            for _ in range(2):
                copy.deepcopy(net)
            res["two_copies_beside_it_s"] = round(time.perf_counter() - tc, 3)
            th.join()
        res["warm_pass_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        for _ in range(2):
            copy.deepcopy(net)
        res["two_copies_alone_s"] = round(time.perf_counter() - t, 3)
    if a.mode == "profile":
        res.update(profile_passes(net, x))
    for i in range(3):
        t = time.perf_counter()
        model_pass(net, x)
        res[f"forward_backward_{i + 1}_s"] = round(time.perf_counter() - t, 3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
