"""libreyolo bench export [models=LibreYOLO9t,LibreYOLOXs imgsz=640 runs=20 threads=1 dynamo=false]: inference
latency per image of each model exported to ONNX and run by onnxruntime on the CPU, beside the same network in
PyTorch eager on the CPU, both on `threads` threads (default 1: on a shared machine a thread pool that spins
against other processes measures them, not the graph). Untrained networks of 80 classes (latency does not depend
on the weights); batch 1, the median of `runs` timed runs after 3 untimed ones; the network alone (no pre- or
post-processing). The exporter is the TorchScript-based one unless dynamo=auto|true (the dynamo exporter takes
tens of seconds per model at 640 px on 2 cores)."""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from libreyolo.cli.args import parse_kv
from libreyolo.errors import ConfigError
from libreyolo.families import model_names
from libreyolo.keys import bool_or, imgsz, integer


def _median_ms(fn: Callable[[], Any], runs: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    extra = {"models": str, "imgsz": imgsz, "runs": integer, "dynamo": bool_or("auto"), "threads": integer}
    kw = parse_kv(argv, set(), extra, command="bench export")
    names = kw.get("models", ",".join(model_names())).split(",")
    unknown = [n for n in names if n not in model_names()]
    if unknown:
        raise ConfigError(f"models={unknown[0]!r} is not a model name; known: {', '.join(model_names())}")
    size, runs, threads = kw.get("imgsz", 640), kw.get("runs", 20), kw.get("threads", 1)
    import onnxruntime as ort

    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1

    from libreyolo import LibreYOLO

    print(
        f"| model | onnxruntime CPU ms/image | PyTorch eager CPU ms/image | exporter | {size} px, batch 1, "
        f"{threads} thread(s) |"
    )
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            m = LibreYOLO(name)
            m.imgsz = size
            logs: list[str] = []
            path = m.export(file=str(Path(tmp) / f"{name}.onnx"), dynamo=kw.get("dynamo", False), log=logs.append)
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            x = torch.rand(1, 3, size, size)
            feed = {"images": x.numpy()}
            ort_ms = _median_ms(functools.partial(session.run, None, feed), runs)
            net = m.net.eval()
            with torch.no_grad():
                torch_ms = _median_ms(functools.partial(net, x), runs)
            print(f"| {name} | {ort_ms:.1f} | {torch_ms:.1f} | {LibreYOLO(str(path)).exported.exporter} | |")
    return 0
