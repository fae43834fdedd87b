"""LibreYOLO 1.6's RTMDet or D-FINE training step, timed the way `libreyolo bench step` times ours, on the same batch.

    pip install --no-deps --target /tmp/ly16 libreyolo==1.6.0 tqdm     # or LIBREYOLO16_DIR, as tests/test_weights16
    python benchmarks/libreyolo16_step.py --ly16 /tmp/ly16 --size t --batch 8 --imgsz 640 --modes eager,graph
    python benchmarks/libreyolo16_step.py --ly16 /tmp/ly16 --family dfine --size s --batch 8 --imgsz 640

Issue 52 asks for RTMDet-t's whole captured step beside 1.6's own step for the same model, measured in one call. 1.6
is also named `libreyolo`, so it cannot be imported beside this project: this script makes `bench step`'s batch (the
built-in shapes dataset, same seed, this project's augmentation for the family: mosaic for RTMDet, none for D-FINE)
with this project, saves it, and runs itself again in a child process with only 1.6 on the path (--ly16, plus --deps
for tqdm where it lies apart), which times 1.6's step and prints one JSON line per mode.

RTMDet (--family rtmdet, the default; sizes t s m l x): what runs per step is the body of 1.6's trainer for one batch
(BaseTrainer's forward through its CUDA-graph manager, RTMDetTrainer's loss, the scaled backward), and every
`accumulate` = nbs / batch steps (nbs 64 unless --nbs) the optimizer step (unscale, scaler step and update, zero_grad,
ModelEMA update; no clipping: RTMDetConfig sets none). `eager`: 1.6's plain step. `graph`: 1.6's `cuda_graph=True`,
its TrainGraphManager capturing the network's forward and backward while the assigner and loss run eagerly (its
RTMDetTrainer.cuda_graph_train_spec). Optimizer: AdamW at 0.004, weight decay 0.05 on weights only (RTMDetConfig).

D-FINE (--family dfine; sizes n s m, those this project has; 1.6 has l and x too): the step is 1.6's own
DFINETrainer methods on a trainer object made without its __init__: `_forward_train` (on_forward: the padded pixel
targets to per-image normalised cx, cy, w, h dicts, LibreDFINEModel's forward with them, so the decoder builds its
contrastive denoising queries (100, label noise 0.5, box noise 1.0) from them, then `build_criterion`'s DFINECriterion:
Hungarian matching, VFL, L1, GIoU, FGL, DDF over the main, auxiliary, pre, encoder and denoising outputs), the
backward, and the optimizer step of DFINETrainer._train_epoch: zero_grad, backward, gradient norm clipped to 0.1
(clip_max_norm; unscaled first under AMP), optimizer step, ModelEMA update (decay 0.9999, tau 2000) - every step when
nbs is unset, which is 1.6's DFINEConfig default (--nbs 0); by default nbs is 32, ours for D-FINE, and 1.6 then runs
_train_epoch_accum's body: zero_grad at the window's start, loss / accumulate, the clip, step and EMA once per window.
Optimizer: DFINETrainer._setup_optimizer's AdamW (betas 0.9, 0.999; fused on CUDA via 1.6's build_optimizer) at 2e-4,
weight decay 1e-4, four groups: backbone at 0.5x lr, and no decay on names holding norm, bn, bias or lab.scale. AMP:
DFINEConfig's amp=True, float16 with a GradScaler, on CUDA only (as BaseTrainer; float32 on a CPU). The network is built
as when 1.6 fine-tunes from weights, its HGNetv2 stem frozen (pretrained=False would train it too); the batch is RGB in
[0, 1] as float32 with targets padded to 120 rows, copied to the device every step as 1.6's loader hands it over.
`eager`: 1.6's plain step. `graph`: 1.6's `cuda_graph=True`: DETREncoderCudaGraphMixin.cuda_graph_train_spec, the
backbone and encoder captured by its TrainGraphManager while the decoder (its denoising queries change with the boxes
per image) and the criterion run eagerly. 1.6's D-FINE cannot run below 128 px (s, m) or 256 px (n): its encoder
keeps 300 top tokens, and the script says so rather than crash.

Left out, in 1.6's favour, for both: the data loader (and D-FINE's multi-scale collate, its per-batch resize), the
progress bar and the per-step loss logging (D-FINE: `.item()` of the total and each term), the LR schedule's per-step
update. Timing as `bench step`: each step between two CUDA events with a synchronisation after it (median, min), and
the timed steps back to back (mean). Each JSON line names the model (family and size), mode, batch, imgsz, accumulate
and the figures; a D-FINE line adds nbs, amp, clip_max_norm, lr0 and weight_decay."""

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

SIZES = {"rtmdet": ("t", "s", "m", "l", "x"), "dfine": ("n", "s", "m")}  # dfine: the sizes this project has


def parent(a: argparse.Namespace) -> None:
    """Make bench step's batch with this project, then time 1.6 on it in a child process."""
    from libreyolo.bench.step import _batch_on_device
    from libreyolo.config import TrainConfig

    prefix = {"rtmdet": "LibreRTMDet", "dfine": "LibreDFINE"}[a.family]
    if a.size not in SIZES[a.family]:
        raise SystemExit(f"--family {a.family} has sizes {', '.join(SIZES[a.family])} here, not {a.size!r}")
    cfg = TrainConfig.from_overrides({"model": f"{prefix}{a.size}", "batch": a.batch, "imgsz": a.imgsz})
    data, nc = _batch_on_device(cfg, a.batch, torch.device("cpu"))
    # rtmdet: 64 as before; dfine: our D-FINE's nbs (its recipe's 32), which 1.6 accumulates to through config.nbs
    nbs = a.nbs if a.nbs is not None else 64 if a.family == "rtmdet" else int(cfg.nbs)
    with tempfile.TemporaryDirectory() as tmp:
        batch = Path(tmp) / "batch.pt"
        rec = {"img": data["img"], "targets": data["targets"], "mask": data["mask"], "nc": nc, "nbs": nbs}
        torch.save(rec, batch)
        path = os.pathsep.join(os.path.abspath(p) for p in (a.ly16, a.deps) if p)  # the child runs in tmp
        env = {**os.environ, "PYTHONPATH": path}
        argv = [sys.executable, __file__, "--child", str(batch), *sys.argv[1:]]
        rc = subprocess.run(argv, env=env, cwd=tmp).returncode
    if rc:
        raise SystemExit(rc)


def child(a: argparse.Namespace) -> None:
    import libreyolo

    if not hasattr(libreyolo, "LibreRTMDet"):
        raise SystemExit(f"expected LibreYOLO 1.6 on PYTHONPATH, imported {libreyolo.__file__}")
    rec = torch.load(a.child, weights_only=True)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        if a.family == "rtmdet":
            accumulate = max(round(rec["nbs"] / a.batch), 1)
            step, manager = _rtmdet_step(a, rec, device, mode, accumulate)
            extra = {}
        else:
            step, manager, accumulate, extra = _dfine_step(a, rec, device, mode)
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            step()
        if cuda:
            torch.cuda.synchronize()
        warmup_s = time.perf_counter() - t0
        times, mean_ms = _timed(step, a.steps, cuda)
        row = {
            "libreyolo": libreyolo.__version__ if hasattr(libreyolo, "__version__") else "1.6",
            "model": f"{'RTMDet' if a.family == 'rtmdet' else 'DFINE'}-{a.size}",
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
            **extra,
        }
        print(json.dumps(row), flush=True)


def _rtmdet_step(a: argparse.Namespace, rec: dict, device: torch.device, mode: str, accumulate: int):
    """1.6's RTMDet step for one batch -> (step, graph manager or None)."""
    from libreyolo.models.rtmdet.loss import RTMDetLoss
    from libreyolo.models.rtmdet.nn import LibreRTMDetModel
    from libreyolo.training.cuda_graph import CudaGraphTrainSpec, GraphableNetwork, TrainGraphManager
    from libreyolo.training.ema import ModelEMA

    cuda = device.type == "cuda"
    # 1.6's targets: (B, M, 5) class, centre x, y, width, height in pixels, zero rows as padding
    targets = _xywh_targets(rec).to(device)
    mean = torch.tensor([103.53, 116.28, 123.675], device=device).view(1, 3, 1, 1)
    std = torch.tensor([57.375, 57.12, 58.395], device=device).view(1, 3, 1, 1)
    host_img = rec["img"].pin_memory() if cuda else rec["img"]
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

    return step, manager


def _dfine_step(a: argparse.Namespace, rec: dict, device: torch.device, mode: str):
    """1.6's D-FINE step for one batch, through 1.6's own DFINETrainer methods -> (step, manager, accumulate, extra).

    The trainer is made without its __init__ (no data, no run folder) and holds only what the methods used here
    read: config, device, model, criterion, optimizer, scaler, EMA and the graph manager."""
    from contextlib import nullcontext

    from libreyolo.models.dfine.nn import LibreDFINEModel
    from libreyolo.models.dfine.trainer import DFINETrainer
    from libreyolo.training.config import DFINEConfig
    from libreyolo.training.cuda_graph import TrainGraphManager
    from libreyolo.training.ema import ModelEMA
    from libreyolo.utils.amp import amp_uses_grad_scaler

    cuda = device.type == "cuda"
    cfg = DFINEConfig(size=a.size, num_classes=rec["nc"], batch=a.batch, imgsz=a.imgsz, nbs=rec["nbs"] or None)
    tr = DFINETrainer.__new__(DFINETrainer)
    tr.config, tr.device = cfg, device
    tr.model = model = LibreDFINEModel(a.size, rec["nc"]).to(device).train()  # as from weights: stem frozen
    dec = model.decoder  # its encoder picks num_queries tokens out of every level's cells (topk: at least that many)
    if sum(((a.imgsz + st - 1) // st) ** 2 for st in dec.feat_strides) < dec.num_queries:
        raise SystemExit(
            f"1.6's D-FINE-{a.size} cannot train at {a.imgsz} px: fewer tokens than its {dec.num_queries} queries"
        )
    tr.criterion = tr.build_criterion()
    tr.optimizer = opt = tr._setup_optimizer()  # AdamW, {backbone x0.5, head} x {decay, no decay}, fused on CUDA
    use_amp = cfg.amp and cuda  # BaseTrainer: AMP (and its scaler) on CUDA only
    scaler = tr.scaler = torch.amp.GradScaler("cuda", enabled=amp_uses_grad_scaler(cfg.amp_dtype)) if use_amp else None
    ema = tr.ema_model = ModelEMA(model, decay=cfg.ema_decay, tau=getattr(cfg, "ema_tau", 2000)) if cfg.ema else None
    accumulate = tr._accum_steps
    if mode == "graph":  # BaseTrainer: cuda_graph=True gives the manager; _forward_train asks the family for its spec
        tr._cuda_graph_manager = TrainGraphManager(preserve_accumulated_grads=accumulate > 1)
    elif mode != "eager":
        raise SystemExit(f"unknown mode {mode!r}: eager or graph")
    manager = getattr(tr, "_cuda_graph_manager", None)
    clip = float(getattr(cfg, "clip_max_norm", 0.0))
    # 1.6's D-FINE batch: RGB in [0, 1] as float32 (its transform runs on the host), targets padded to 120 rows
    host_img = (rec["img"].permute(0, 3, 1, 2).float() / 255).contiguous()
    t = _xywh_targets(rec)
    host_t = torch.nn.functional.pad(t, (0, 0, 0, max(120 - t.shape[1], 0)))
    if cuda:
        host_img, host_t = host_img.pin_memory(), host_t.pin_memory()
    n = 0

    def step() -> None:  # DFINETrainer._train_epoch (accumulate 1) or _train_epoch_accum's body for one batch
        nonlocal n
        imgs = host_img.to(device, non_blocking=True)
        targets = host_t.to(device, non_blocking=True)
        if accumulate > 1 and n % accumulate == 0:
            opt.zero_grad(set_to_none=True)
        n += 1
        with tr._autocast_context() if scaler is not None else nullcontext():
            loss = tr._forward_train(imgs, targets, None)["total_loss"]
        if accumulate == 1:
            opt.zero_grad()
        else:
            loss = loss / accumulate
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if n % accumulate:
            return
        if clip > 0:
            if scaler is not None:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if ema is not None:
            ema.update(model)

    extra = {"nbs": cfg.nbs, "amp": use_amp, "clip_max_norm": clip, "lr0": cfg.lr0, "weight_decay": cfg.weight_decay}
    return step, manager, accumulate, extra


def _xywh_targets(rec: dict) -> torch.Tensor:
    """Our x1, y1, x2, y2 pixel targets as 1.6's (B, M, 5) class, centre x, y, width, height, zero rows padding."""
    t = rec["targets"]
    xywh = torch.cat((t[..., :1], (t[..., 1:3] + t[..., 3:5]) / 2, t[..., 3:5] - t[..., 1:3]), -1)
    return torch.where(rec["mask"][..., None], xywh, 0.0)


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
    ap.add_argument("--deps", default=os.environ.get("LIBREYOLO16_DEPS", ""), help="more folders for the child (tqdm)")
    ap.add_argument("--family", default="rtmdet", choices=tuple(SIZES))
    ap.add_argument("--size", choices=("t", "n", "s", "m", "l", "x"), help="default: t for rtmdet, s for dfine")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument(
        "--nbs", type=int, default=None, help="accumulate round(nbs / batch) (rtmdet: 64; dfine: 32; 0: none)"
    )
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.size = a.size or ("t" if a.family == "rtmdet" else "s")
    if a.child:
        child(a)
    elif not a.ly16:
        raise SystemExit("name LibreYOLO 1.6's folder: --ly16 DIR or LIBREYOLO16_DIR")
    else:
        parent(a)


if __name__ == "__main__":
    main()
