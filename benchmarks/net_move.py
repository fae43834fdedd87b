"""The train net's build and move to the GPU alone, in a fresh process (as `libreyolo train` starts CUDA: the
driver's start begun before torch is imported), to compare with what the same work takes inside a run's start
(benchmarks/start_trace.py), where loader threads page-lock batches beside it.

    python benchmarks/net_move.py two|one|init_first [MODEL]

two: `.to(device)` then `.to(memory_format=channels_last)`, as the setup does; one: both in one `.to()`;
init_first: torch's CUDA state and a first allocation made before the move, timed apart. Then two deep copies
(nn/clone.py: the warm-up's and the EMA's). Prints one JSON line of seconds."""

from __future__ import annotations

import json
import sys
import time

T0 = time.perf_counter()


def main(mode: str, model: str) -> None:
    from libreyolo.cli import cudastart

    thread = cudastart.start(["train"])
    import torch

    from libreyolo.config import TrainConfig
    from libreyolo.families import parse_model_name
    from libreyolo.nn.clone import clone

    out: dict[str, object] = {"mode": mode, "model": model, "import_s": round(time.perf_counter() - T0, 3)}

    def lap(key: str, t: float) -> None:
        torch.cuda.synchronize()
        out[key] = round(time.perf_counter() - t, 3)

    t = time.perf_counter()
    if thread is not None:
        thread.join()
    out["driver_wait_s"] = round(time.perf_counter() - t, 3)
    cfg = TrainConfig.from_overrides({"model": model})
    family, size = parse_model_name(model)
    t = time.perf_counter()
    net = family.train_net(family.build(size, 4), cfg)
    out["build_s"] = round(time.perf_counter() - t, 3)
    if mode == "init_first":
        t = time.perf_counter()
        torch.empty(1, device="cuda")
        lap("cuda_init_s", t)
    t = time.perf_counter()
    if mode == "one":
        net = net.to("cuda", memory_format=torch.channels_last)
    else:
        net = net.to("cuda").to(memory_format=torch.channels_last)
    lap("move_s", t)
    for key in ("clone_s", "clone_again_s"):
        t = time.perf_counter()
        clone(net, {})
        lap(key, t)
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("two", "one", "init_first"):
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "LibreYOLO9t")
