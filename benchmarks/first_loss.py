"""A process's first training forward, loss and backward, with and without the loss's first call beside it.

    python benchmarks/first_loss.py plain|beside [--model LibreYOLO9t] [--batch 16] [--imgsz 640] [--profile]

Run each mode in a fresh process. Both build the model's train net on the GPU and one batch of the built-in
dataset, then time three passes (forward under float16 autocast and the loss, then the backward), each
synchronised. beside: the kernel warm-up's own loss_beside (engine/warmup.py) runs the loss's forward and backward
on the family's example outputs in a thread while the main thread runs the first network forward. --profile: the
first and second passes' ops under torch.profiler (CPU), those whose self time grew most on the first pass.
Prints the marks (seconds since launch) and one JSON line."""

from __future__ import annotations

import argparse
import json
import time

T0 = time.perf_counter()
import torch  # noqa: E402  (timed)

from libreyolo.bench.step import _batch_on_device  # noqa: E402
from libreyolo.config import TrainConfig  # noqa: E402
from libreyolo.engine.step import feed_targets, train_forward  # noqa: E402
from libreyolo.engine.warmup import loss_beside  # noqa: E402
from libreyolo.families import parse_model_name  # noqa: E402


def self_ms(prof: torch.profiler.profile) -> dict[str, float]:
    return {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plain", "beside"])
    ap.add_argument("--model", default="LibreYOLO9t")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    marks: dict[str, float] = {"import_torch": time.perf_counter() - T0}
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = TrainConfig.from_overrides({"model": a.model, "batch": a.batch, "imgsz": a.imgsz})
    data, nc = _batch_on_device(cfg, a.batch, dev)
    family, size = parse_model_name(a.model)
    net = family.build(size, nc)
    train = family.train_net(net, cfg).to(dev).train()  # moves net too: it is the detector inside the train net
    loss_fn = family.loss(net, cfg, None)
    imgsz = (data["img"].shape[1], data["img"].shape[2])
    dtype = torch.float16 if cuda else None
    sync()
    marks["ready"] = time.perf_counter() - T0
    beside = None
    if a.mode == "beside":  # what the kernel warm-up starts beside its forward (engine/warmup.py)
        if family.example_outputs is None:
            raise SystemExit(f"{family.name} gives no example outputs")
        beside = loss_beside(
            family.loss(net, cfg, None), family.example_outputs, train, a.batch, imgsz, dtype or torch.float32,
            data["targets"], data["mask"], 1.0, dev,
        )  # fmt: skip
    tables: list[dict[str, float]] = []
    for i in range(3):
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if a.profile and i < 2 else None
        if prof is not None:
            prof.__enter__()
        feed_targets(train, data["targets"], data["mask"], imgsz)  # a DETR's denoising queries, as the step does
        out = train_forward(train, data["img"], dtype, False)
        if beside is not None:
            beside.join()
            beside = None
            sync()
            marks["loss_beside_joined"] = time.perf_counter() - T0
        loss = loss_fn(out, data["targets"], data["mask"], imgsz, 1.0)[0]
        sync()
        marks[f"forward_loss_{i + 1}"] = time.perf_counter() - T0
        loss.backward()
        sync()
        marks[f"backward_{i + 1}"] = time.perf_counter() - T0
        train.zero_grad(set_to_none=True)
        if prof is not None:
            prof.__exit__(None, None, None)
            tables.append(self_ms(prof))
    res: dict[str, object] = {"mode": a.mode, **{k: round(v, 3) for k, v in marks.items()}}
    res["first_pass_s"] = round(marks["backward_1"] - marks["ready"], 3)
    if tables:
        first, second = tables
        grew = sorted(first, key=lambda k: second.get(k, 0.0) - first[k])[:25]
        res["first_pass_self_ms_grew"] = [[k, round(first[k], 1), round(second.get(k, 0.0), 1)] for k in grew]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
