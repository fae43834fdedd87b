"""What a process's first forward and backward cost on the GPU, and whether a thread can take part of it.

    python benchmarks/first_pass.py plain|lib|thread [--model LibreYOLO9t] [--batch 16] [--imgsz 640]

Run each mode in a fresh process. plain: import torch, create the CUDA context, then three forward+backward passes
of the model (float16 autocast, channels_last). lib: first a tiny convolution and matrix product (cuDNN and cuBLAS
loaded) in the main thread. thread: the same tiny warm-up in a second thread while the main thread counts in a
Python loop, which shows how much interpreter time the warm-up leaves it. Prints one JSON line of seconds."""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plain", "lib", "thread"])
    ap.add_argument("--model", default="LibreYOLO9t")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
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
    for i in range(3):
        t = time.perf_counter()
        model_pass(net, x)
        res[f"forward_backward_{i + 1}_s"] = round(time.perf_counter() - t, 3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
