"""Where a thread's time goes, from py-spy's native samples: waiting for the interpreter lock, waiting on another
lock, in the CUDA driver, in cuDNN, in torch's C++ or in Python.

    py-spy record --native --threads --idle --rate 250 --format raw -o S.txt -- python benchmarks/eager_split.py ...
    python benchmarks/stack_split.py S.txt[.gz] [--thread MainThread] [--within EagerStep.__call__]

(gzip the raw file where it has to travel: 160 steps of the eager step gave 23 MB, over the device tool's limit.)

py-spy samples the threads that run Python (the loop's, the overlapped backward's helper), not autograd's own
device thread. Each sample of the named thread whose stack holds `--within` (the timed steps) is put in the first
class its stack matches, from the innermost frame outwards:
- interpreter lock: taking or handing over the GIL (`take_gil`, `PyEval_RestoreThread`, `PyGILState_Ensure`,
  pybind11's `gil_scoped_*`, or a wait right under a Python frame: the eval loop's switch);
- other lock: a futex or mutex wait (`__lll_lock_wait`, `futex`, `pthread_mutex_lock`, `pthread_cond_wait`, or an
  unnamed libc frame at the leaf), named by the nearest library frame above it;
- joining a thread (`Thread.join`: the loop waiting for an overlapped backward);
- waiting for autograd's queue: autograd's device thread idle between backwards, or a thread that called backward()
  waiting for it (`--thread "thread (" --within Engine::thread_init` selects the device thread, which has no Python
  name; py-spy samples it once it has taken the interpreter lock);
- CUDA driver (`libcuda`), cuDNN (`libcudnn`), cuBLAS (`libcublas`);
- torch's C++ (`libtorch`, `libc10`): dispatch, autograd recording, the caching allocator;
- Python: the innermost frame is Python code.
Prints one JSON line: samples per class, and the top innermost native frames of the lock waits."""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re

GIL = (
    "take_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyGILState_Ensure",
    "drop_gil",
    "gil_scoped_acquire",
)
UNNAMED_LIBC = re.compile(r"^0x[0-9a-f]+ \(libc\.so")
WAIT = ("__lll_lock_wait", "futex", "pthread_mutex_lock", "pthread_cond_wait", "pthread_cond_timedwait", "sem_wait")
LIBS = (("libcuda", "CUDA driver"), ("libcudnn", "cuDNN"), ("libcublas", "cuBLAS"))
PY_FRAME = re.compile(r"\((?:[^()]*\.py):\d+\)$")


def classify(frames: list[str]) -> tuple[str, str | None]:
    """frames outermost first -> (class, detail)."""
    inner = frames[::-1]
    if any("Thread.join" in f for f in inner):
        return "joining a thread", None
    if any("ReadyQueue::pop" in f for f in inner):
        return "waiting for autograd's queue", None
    for i, f in enumerate(inner):
        if any(g in f for g in GIL):
            return "interpreter lock", None
        # an unnamed libc frame at the leaf: the futex and condition-variable waits (py-spy resolves no names there)
        if any(w in f for w in WAIT) or (i == 0 and UNNAMED_LIBC.match(f)):
            # the waiter: the first frame above the wait outside libc (the interpreter's own GIL code is often
            # unnamed inside the python binary, so a wait right under a Python frame is the eval loop's hand-off)
            owner = next((g for g in inner[i + 1 :] if "libc.so" not in g), "?")
            if PY_FRAME.search(owner) or "gil_scoped" in owner or "python" in owner.rsplit("(", 1)[-1]:
                return "interpreter lock", None
            return "other lock", owner.split(" (")[0][:120]
        if PY_FRAME.search(f):
            break  # the innermost Python frame: what is below it decides
    for f in inner:
        if PY_FRAME.search(f):
            return "Python", None
        for key, name in LIBS:
            if key in f:
                return name, None
        if "libtorch" in f or "libc10" in f:
            return "torch C++", None
    return "other", None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--thread", default="MainThread")
    ap.add_argument("--within", default="EagerStep.__call__")
    a = ap.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    waits: collections.Counter[str] = collections.Counter()
    total = 0
    with gzip.open(a.raw, "rt") if a.raw.endswith(".gz") else open(a.raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if not frames or a.thread not in frames[0] or (a.within and a.within not in stack):
                continue
            k = int(n)
            cls, detail = classify(frames[1:])
            counts[cls] += k
            total += k
            if detail is not None:
                waits[detail] += k
    print(
        json.dumps(
            {
                "thread": a.thread,
                "samples": total,
                "share": {c: round(v / max(total, 1), 3) for c, v in counts.most_common()},
                "lock_waits_by_owner": dict(waits.most_common(8)),
            }
        )
    )


if __name__ == "__main__":
    main()
