"""LibreYOLO 1.6's RTMDet training step, timed the way `libreyolo bench step` times ours, on the same batch.

    pip install --no-deps --target /tmp/ly16 libreyolo==1.6.0 tqdm     # or LIBREYOLO16_DIR, as tests/test_weights16
    python benchmarks/libreyolo16_step.py --ly16 /tmp/ly16 --size t --batch 8 --imgsz 640 --modes eager,graph

Issue 52 asks for RTMDet-t's whole captured step beside 1.6's own step for the same model, measured in one call. 1.6
is also named `libreyolo`, so it cannot be imported beside this project: this script makes `bench step`'s batch (the
built-in shapes dataset, same seed) with this project, saves it, and runs itself again in a child process with only
1.6 on the path, which times 1.6's step and prints one JSON line per mode.

What runs per step is the body of 1.6's trainer for one batch (BaseTrainer's forward through its CUDA-graph manager,
RTMDetTrainer's loss, the scaled backward), and every `accumulate` = nbs / batch steps the optimizer step (unscale,
scaler step and update, zero_grad, ModelEMA update; no clipping: RTMDetConfig sets none). `eager`: 1.6's plain step.
`graph`: 1.6's `cuda_graph=True`, its TrainGraphManager capturing the network's forward and backward while the
assigner and loss run eagerly (its RTMDetTrainer.cuda_graph_train_spec). Optimizer: AdamW at 0.004, weight decay
0.05 on weights only (RTMDetConfig). Left out, in 1.6's favour: the data loader, the progress bar, the LR schedule's
per-step update. Timing as `bench step`: each step between two CUDA events with a synchronisation after it (median,
min), and the timed steps back to back (mean)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def parent(a: argparse.Namespace) -> None:
    """Make bench step's batch with this project, then time 1.6 on it in a child process."""
    from libreyolo.bench.step import _batch_on_device
    from libreyolo.config import TrainConfig

    cfg = TrainConfig.from_overrides({"model": f"LibreRTMDet{a.size}", "batch": a.batch, "imgsz": a.imgsz})
    data, nc = _batch_on_device(cfg, a.batch, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        batch = Path(tmp) / "batch.pt"
        torch.save({"img": data["img"], "targets": data["targets"], "mask": data["mask"], "nc": nc}, batch)
        env = {**os.environ, "PYTHONPATH": a.ly16}
        argv = [sys.executable, __file__, "--child", str(batch), *sys.argv[1:]]
        subprocess.run(argv, check=True, env=env, cwd=tmp)


def child(a: argparse.Namespace) -> None:
    import libreyolo

    if not hasattr(libreyolo, "LibreRTMDet"):
        raise SystemExit(f"expected LibreYOLO 1.6 on PYTHONPATH, imported {libreyolo.__file__}")
    from libreyolo.models.rtmdet.loss import RTMDetLoss
    from libreyolo.models.rtmdet.nn import LibreRTMDetModel
    from libreyolo.training.cuda_graph import CudaGraphTrainSpec, GraphableNetwork, TrainGraphManager
    from libreyolo.training.ema import ModelEMA

    rec = torch.load(a.child, weights_only=True)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    # 1.6's targets: (B, M, 5) class, centre x, y, width, height in pixels, zero rows as padding
    t = rec["targets"]
    xywh = torch.cat((t[..., :1], (t[..., 1:3] + t[..., 3:5]) / 2, t[..., 3:5] - t[..., 1:3]), -1)
    targets = torch.where(rec["mask"][..., None], xywh, 0.0).to(device)
    mean = torch.tensor([103.53, 116.28, 123.675], device=device).view(1, 3, 1, 1)
    std = torch.tensor([57.375, 57.12, 58.395], device=device).view(1, 3, 1, 1)
    host_img = rec["img"].pin_memory() if cuda else rec["img"]
    accumulate = max(round(a.nbs / a.batch), 1)

    def one_mode(mode: str) -> None:
        torch.manual_seed(0)
        model = LibreRTMDetModel(a.size, rec["nc"]).to(device).train()
        loss_fn = RTMDetLoss(rec["nc"], distributed_normalize=False)
        ema = ModelEMA(model, decay=0.9998)
        decay, plain = [], []
        for mod in model.modules():
            for name, p in mod.named_parameters(recurse=False):
                norm = isinstance(mod, torch.nn.modules.batchnorm._NormBase)
                (plain if name == "bias" or norm else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": plain, "weight_decay": 0.0}], 4e-3)
        scaler = torch.amp.GradScaler("cuda", enabled=cuda)
        manager = TrainGraphManager(preserve_accumulated_grads=accumulate > 1) if mode == "graph" else None
        network = GraphableNetwork(model)

        def loss_from_head(cls_scores, bbox_preds):  # RTMDetTrainer._loss_from_head's conversion, then its loss
            boxes, labels = [], []
            for tb in targets:
                tb = tb[(tb[:, 3:5] > 0).all(1)]
                boxes.append(torch.cat((tb[:, 1:3] - tb[:, 3:5] / 2, tb[:, 1:3] + tb[:, 3:5] / 2), 1))
                labels.append(tb[:, 0].long())
            return loss_fn(cls_scores, bbox_preds, boxes, labels)

        spec = CudaGraphTrainSpec(
            network=network, assemble=lambda flat, i, tg, p=None: loss_from_head(*network.rebuild(flat))
        )
        n = 0

        def step() -> None:
            nonlocal n
            n += 1
            img = host_img.to(device, non_blocking=cuda).permute(0, 3, 1, 2).float().flip(1)  # 1.6 takes BGR
            imgs = (img - mean) / std
            with torch.autocast(device.type, dtype=torch.float16, enabled=cuda, cache_enabled=manager is None):
                flat = manager.run(spec, imgs) if manager is not None else None
                out = spec.assemble(flat, imgs, targets) if flat is not None else loss_from_head(*model(imgs))
            scaler.scale(out["total_loss"]).backward()
            if n % accumulate == 0:
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
        times, mean_ms = _timed(step, a.steps, cuda)
        row = {
            "libreyolo": libreyolo.__version__ if hasattr(libreyolo, "__version__") else "1.6",
            "model": f"RTMDet-{a.size}",
            "mode": mode,
            "captured": bool(manager is not None and manager.captured),
            "batch": a.batch,
            "imgsz": a.imgsz,
            "accumulate": accumulate,
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "mean_ms": mean_ms,
            "warmup_s": warmup_s,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
        }
        print(json.dumps(row), flush=True)

    for mode in a.modes.split(","):
        one_mode(mode)


def _timed(step, steps: int, cuda: bool) -> tuple[list[float], float]:
    """libreyolo.bench.step.timed_steps, repeated here: the child cannot import this project."""
    times, t_window = [], time.perf_counter()
    for _ in range(steps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1000)
    if cuda:
        torch.cuda.synchronize()
    return times, (time.perf_counter() - t_window) * 1000 / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--ly16", default=os.environ.get("LIBREYOLO16_DIR", ""), help="folder LibreYOLO 1.6 is installed in"
    )
    ap.add_argument("--size", default="t", choices=("t", "s", "m", "l", "x"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--nbs", type=int, default=64)
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
    elif not a.ly16:
        raise SystemExit("name LibreYOLO 1.6's folder: --ly16 DIR or LIBREYOLO16_DIR")
    else:
        parent(a)


if __name__ == "__main__":
    main()
