"""Which shared libraries a process's first training pass opens after `import torch`, and what opening them in a
thread during the import saves (needs a CUDA GPU; run each mode in a fresh process).

    python benchmarks/cuda_libs.py plain [--list OUT.json]      # also writes the libraries the pass opened
    python benchmarks/cuda_libs.py early [--list IN.json]       # those opened by a thread while torch imports
    python benchmarks/cuda_libs.py early+handle [--list IN.json]

plain: `import torch`, the CUDA context, then three forward+backward passes of the model (float16 autocast,
channels_last, as benchmarks/first_pass.py), listing the shared objects mapped after each part (/proc/self/maps).
early: a thread started before `import torch` dlopens the libraries `plain` saw opened by the first pass (through
libc's dlopen called by ctypes, which lets go of the interpreter lock). early+handle: that thread also retains
the device's primary context and creates and destroys a cuDNN handle. Prints one JSON line of seconds."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

T0 = time.perf_counter()
RTLD_NOW_GLOBAL = 0x102


def mapped() -> dict[str, str]:
    """basename -> path of every shared object mapped now."""
    out: dict[str, str] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if ".so" in path and path.startswith("/"):
                out[os.path.basename(path)] = path
    return out


def opener(paths: list[str], handle: bool, log: dict[str, object]) -> None:
    libc = ctypes.CDLL(None)
    libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    if handle:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        cuda.cuInit(0)
        cuda.cuDeviceGet(ctypes.byref(dev), 0)
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        cuda.cuCtxSetCurrent(ctx)
    opened = []
    for p in paths:
        t = time.perf_counter()
        ok = bool(libc.dlopen(p.encode(), RTLD_NOW_GLOBAL))
        opened.append([os.path.basename(p), ok, round(time.perf_counter() - t, 3)])
    log["opened"] = opened
    if handle:
        t = time.perf_counter()
        sub = next((p for p in paths if os.path.basename(p).startswith("libcudnn_")), None)
        if sub:
            lib = ctypes.CDLL(os.path.join(os.path.dirname(sub), "libcudnn.so.9"))
            h = ctypes.c_void_p()
            log["cudnnCreate_rc"] = lib.cudnnCreate(ctypes.byref(h))
            lib.cudnnDestroy(h)
        log["handle_s"] = round(time.perf_counter() - t, 3)
    log["thread_done_at_s"] = round(time.perf_counter() - T0, 3)


def main() -> None:
    mode = sys.argv[1]
    lst = sys.argv[sys.argv.index("--list") + 1] if "--list" in sys.argv else "/tmp/cuda_libs.json"
    res: dict[str, object] = {"mode": mode}
    th = None
    if mode.startswith("early"):
        paths = json.load(open(lst))
        th = threading.Thread(target=opener, args=(paths, "handle" in mode, res), daemon=True)
        th.start()
    t = time.perf_counter()
    import torch

    res["import_torch_s"] = round(time.perf_counter() - t, 3)
    from benchmarks.first_pass import model_pass
    from libreyolo import LibreYOLO

    before = mapped()
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["cuda_context_s"] = round(time.perf_counter() - t, 3)
    net = LibreYOLO("LibreYOLO9t").net.cuda().to(memory_format=torch.channels_last).train()
    x = torch.zeros(16, 3, 640, 640, device="cuda").to(memory_format=torch.channels_last)
    if th is not None:
        t = time.perf_counter()
        th.join()
        res["waited_for_thread_s"] = round(time.perf_counter() - t, 3)
    ctx_maps = mapped()
    for i in range(3):
        t = time.perf_counter()
        model_pass(net, x)
        res[f"forward_backward_{i + 1}_s"] = round(time.perf_counter() - t, 3)
        if i == 0:
            after = mapped()
    res["total_to_pass_1_end_s"] = round(time.perf_counter() - T0, 3)  # rough: includes passes 2-3 (subtract)
    new = [after[k] for k in after if k not in ctx_maps]
    res["opened_by_first_pass"] = [os.path.basename(p) for p in new]
    res["opened_by_context_and_model"] = [k for k in ctx_maps if k not in before]
    res["sizes_mb"] = {os.path.basename(p): round(os.path.getsize(p) / 2**20) for p in new}
    if mode == "plain":
        json.dump(new, open(lst, "w"))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
