"""The CUDA driver's start, begun beside `import torch` (the CLI only).

A GPU command's process spends 1.5-2.1 s importing torch, then ~0.3 s on the CUDA driver's init and the device's
primary context, both under the interpreter lock (H200, docs/performance.md). The driver's part needs no torch:
a thread started before the import calls cuInit and retains the device's primary context through ctypes (which
lets go of the lock during the call), and torch's own init later finds both done: it uses that same primary
context. Nothing here is required: without a driver, a GPU, or with a device this cannot name, the thread does
nothing and torch starts CUDA as it always does (and reports any error)."""

from __future__ import annotations

import ctypes
import os
import threading

# the commands that put a model on the GPU at once; `bench` only for its GPU benchmarks
GPU_COMMANDS = {"train", "val", "predict", "profile"}
GPU_BENCHES = {"step", "val"}


def device_ordinal(argv: list[str]) -> int | None:
    """The CUDA device (its index among the visible ones) a `libreyolo` command line will run on, if it names one
    plainly: `device=` absent, auto, cuda, or one index; under torchrun, this rank's LOCAL_RANK. None for the CPU,
    MPS, a list of GPUs (the launcher's own process trains on none) and anything else."""
    if not argv or argv[0] not in GPU_COMMANDS | {"bench"} or any(a in ("-h", "--help") for a in argv):
        return None
    if argv[0] == "bench" and (len(argv) < 2 or argv[1] not in GPU_BENCHES):
        return None
    spec = "auto"
    for a in argv[1:]:
        if a.startswith("device="):
            spec = a.split("=", 1)[1].strip().lower()  # the last one wins, as in the key parser
    if spec in ("cpu", "mps"):
        return None
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_RANK"]) if os.environ["LOCAL_RANK"].isdigit() else None
    if spec in ("auto", "", "cuda"):
        return 0
    return int(spec) if spec.isdigit() else None


def _retain_primary_context(ordinal: int) -> None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver (or not Linux)
        return
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return
    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)  # held until the process ends, as torch holds its own


def start(argv: list[str]) -> threading.Thread | None:
    """Begin the driver's init in a daemon thread if the command will use one CUDA device; -> the thread."""
    ordinal = device_ordinal(argv)
    if ordinal is None:
        return None
    t = threading.Thread(target=_retain_primary_context, args=(ordinal,), name="libreyolo-cuda-start", daemon=True)
    t.start()
    return t
