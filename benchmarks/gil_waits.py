"""How often a training backward takes the interpreter lock on autograd's thread, counted on a CPU.

    python benchmarks/gil_waits.py [--keep] [--pin] [--interval 0.002] [--passes 4] -- batch=1 imgsz=64

Since torch 2.10 a tensor that has a Python object keeps it alive while C++ holds other references to the tensor:
when its C++ reference count goes from 1 to 2 torch increfs the Python object, from 2 to 1 it decrefs it, and each
takes the interpreter lock (c10/util/intrusive_ptr.h, "PyObject preservation"). Autograd saves module inputs and
outputs, which the forward handed to Python, so releasing them in the backward takes the lock on autograd's thread,
once per tensor; the overlapped eager step runs that backward while the loop's thread runs Python.

The count: the eager runner's forward and loss (device=cpu), then the backward on a thread while another thread
spins in Python, holding the lock except every `--interval` seconds (sys.setswitchinterval). Each time autograd's
thread needs the lock it waits about one interval, so backward time / interval is about the number of waits.
- `--keep`: backward(retain_graph=True): the saved tensors are released later, when the loop drops the graph;
- `--pin`: each of the weights' stand-ins gets one more C++ reference (a view of it), so that saving it for the
  backward and releasing it never moves its count between 1 and 2.
Prints one JSON line: the waits per pass."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from eager_split import EagerBench  # this folder is on sys.path when run as a script


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--interval", type=float, default=0.002)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    b = EagerBench.build(a.overrides, model="LibreYOLO9t", batch="1", imgsz="64", device="cpu")
    step, data = b.step, b.data
    pins = [p[...] for p in step.flat.proxies.values()] if a.pin and step.flat is not None else []
    imgsz = (data["img"].shape[1], data["img"].shape[2])
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    sys.setswitchinterval(a.interval)
    waits = []
    for _ in range(a.passes):
        loss, _items = step.loss_fn(step.forward(data["img"]), data["targets"], data["mask"], imgsz, step.batch_scale)
        stop.clear()
        spinner = threading.Thread(target=spin)
        spinner.start()
        backward = threading.Thread(target=lambda loss=loss: loss.backward(retain_graph=a.keep))
        t0 = time.perf_counter()
        backward.start()
        backward.join()
        waits.append(round((time.perf_counter() - t0) / a.interval))
        stop.set()
        spinner.join()
        if step.flat is not None:
            step.flat.gather_grads()
        del loss
    print(json.dumps({"keep": a.keep, "pinned_weights": len(pins), "waits_per_backward": waits}))


if __name__ == "__main__":
    main()
