"""libreyolo bench step|loader|val ... : each benchmark lives in libreyolo/bench/<name>.py and has run(argv) -> int."""

from __future__ import annotations

import importlib

from libreyolo.errors import ConfigError

BENCHES = {
    "step": "training step time on one replayed batch: eager, cuda_graph=true, cuda_graph=full",
    "loader": "data loader images/s for each cache mode and a range of worker counts",
    "val": "validation images/s and seconds per stage: loader, forward, loss, NMS, copy, COCO evaluation",
    "export": "onnxruntime CPU latency per image of each model exported to ONNX, beside PyTorch eager",
    "race": "whole `libreyolo train` runs, launch to exit, one per cuda_graph mode, split into their parts",
}


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: libreyolo bench {" + "|".join(BENCHES) + "} [key=value ...]\n")
        for name, help_ in BENCHES.items():
            print(f"  {name:<7} {help_}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHES:
        raise ConfigError(f"unknown benchmark {name!r}; available: {', '.join(BENCHES)}")
    return importlib.import_module(f"libreyolo.bench.{name}").run(rest)
