"""Ultralytics' eager training step, timed the way `libreyolo bench step` times ours, on the same batch.

    pip install --no-deps ultralytics          # benchmark only; the project never imports it
    python benchmarks/ultralytics_step.py --model yolo11n.yaml --batch 8 --imgsz 640 --steps 64

Issue 12 sets our eager step's goal at Ultralytics YOLO11n's eager step on the same GPU (59 ms at batch 8, 640 px,
float16, measured on another machine). The H200 machines we are lent differ in host speed by more than that goal's
margin, and the eager step is host-bound, so the comparison is made in one call: this script and `libreyolo bench
step ... modes=eager` back to back.

What runs per step is the body of Ultralytics' `BaseTrainer._do_train` for one batch: the batch moved to the GPU and
normalised (`DetectionTrainer.preprocess_batch`), the model's forward and loss under float16 autocast, the scaled
backward, and every `accumulate` = nbs / batch steps `optimizer_step` (unscale, clip_grad_norm_ at 10, scaler step
and update, zero_grad, `ModelEMA.update`). Its optimizer is the one `build_optimizer` picks for `auto` in a short
run: AdamW in three parameter groups (weights with decay, norm weights and biases without). Seeds and cuDNN's
settings come from Ultralytics' own `init_seeds`, deterministic by default as in its trainer. Left out, in
Ultralytics' favour: the progress bar's per-step formatting of the mean losses (a read of device values each step),
the warm-up's per-step LR interpolation and the data loader. The batch is the one `bench step` uses (the built-in
shapes dataset, same seed), in Ultralytics' label format.

Timing as `bench step`: each step between two CUDA events with a synchronisation after it (median, min), and the
timed steps back to back (mean, the last step's work included). Prints one JSON line. What it measured beside
our step: docs/performance.md, "The eager step against Ultralytics YOLO11n"."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def ultralytics_batch(batch: int, imgsz: int) -> tuple[dict, int]:
    """bench step's batch -> Ultralytics' dict: img (B, 3, H, W) uint8 on the host, batch_idx, cls and bboxes
    (normalised centre x, y, width, height)."""
    from libreyolo.bench.step import _batch_on_device
    from libreyolo.config import TrainConfig

    cfg = TrainConfig(batch=batch, imgsz=imgsz)
    data, nc = _batch_on_device(cfg, batch, torch.device("cpu"))
    t, m = data["targets"], data["mask"]
    idx = torch.arange(t.shape[0])[:, None].expand_as(m)[m].float()
    rows = t[m]
    h, w = data["img"].shape[1:3]
    x1, y1, x2, y2 = rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4]
    xywh = torch.stack([(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h], 1)
    img = data["img"].permute(0, 3, 1, 2).contiguous()
    return {"img": img, "batch_idx": idx, "cls": rows[:, :1], "bboxes": xywh}, nc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="yolo11n.yaml")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--nbs", type=int, default=64)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Ultralytics' default (init_seeds(deterministic=True): deterministic cuDNN algorithms, no timing)",
    )
    a = ap.parse_args()

    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import ModelEMA, init_seeds

    from libreyolo.bench.step import timed_steps

    device = torch.device(a.device)
    cuda = device.type == "cuda"
    host_batch, nc = ultralytics_batch(a.batch, a.imgsz)
    init_seeds(0, a.deterministic)
    model = DetectionModel(a.model, nc=nc, verbose=False).to(device)
    model.args = get_cfg()  # the loss reads its gains (box, cls, dfl) from here, as the trainer sets it
    model.train()
    ema = ModelEMA(model)
    accumulate = max(round(a.nbs / a.batch), 1)
    decay = 5e-4 * a.batch * accumulate / a.nbs
    groups: list[list[torch.nn.Parameter]] = [[], [], []]
    norms = tuple(v for k, v in torch.nn.__dict__.items() if "Norm" in k)
    for mod in model.modules():
        for name, p in mod.named_parameters(recurse=False):
            groups[2 if "bias" in name else 1 if isinstance(mod, norms) else 0].append(p)
    lr = round(0.002 * 5 / (4 + nc), 6)
    opt = torch.optim.AdamW(groups[2], lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    opt.add_param_group({"params": groups[0], "weight_decay": decay})
    opt.add_param_group({"params": groups[1], "weight_decay": 0.0})
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    if cuda:
        host_batch = {k: v.pin_memory() for k, v in host_batch.items()}
    n = 0

    def step() -> None:
        nonlocal n
        n += 1
        batch = {k: v.to(device, non_blocking=cuda) for k, v in host_batch.items()}
        batch["img"] = batch["img"].float() / 255
        with torch.autocast(device.type, enabled=cuda):
            loss, _items = model(batch)
            loss = loss.sum()
        scaler.scale(loss).backward()
        if n % accumulate == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            ema.update(model)

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    steps = -(-a.steps // accumulate) * accumulate  # whole accumulation cycles, as bench step times
    times, mean_ms = timed_steps(step, steps, cuda)
    out = {
        "model": a.model,
        "batch": a.batch,
        "imgsz": a.imgsz,
        "accumulate": accumulate,
        "steps": steps,
        "deterministic": a.deterministic,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "mean_ms": mean_ms,
        "warmup_s": warmup_s,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
