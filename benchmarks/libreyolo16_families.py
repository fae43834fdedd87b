"""LibreYOLO 1.6's training step per family, for benchmarks/libreyolo16_step.py (run in its child, with only 1.6 on
the path). Each family part turns `bench step`'s batch into what 1.6's loader hands its trainer, builds 1.6's network
and returns the step; what runs per step, family by family:

RTMDet (--family rtmdet, the default; sizes t s m l x): the body of 1.6's trainer for one batch (BaseTrainer's
forward through its CUDA-graph manager, RTMDetTrainer's loss, the scaled backward), and every `accumulate` = nbs /
batch steps (nbs 64 unless --nbs) the optimizer step (unscale, scaler step and update, zero_grad, ModelEMA update; no
clipping: RTMDetConfig sets none). `eager`: 1.6's plain step. `graph`: 1.6's `cuda_graph=True`, its
TrainGraphManager capturing the network's forward and backward while the assigner and loss run eagerly (its
RTMDetTrainer.cuda_graph_train_spec). Optimizer: AdamW at 0.004, weight decay 0.05 on weights only (RTMDetConfig).
The batch is copied as uint8 and normalised (BGR, mmdet's mean and std) on the device.

The other families run 1.6's own trainer methods on a trainer object made without its __init__ (no data, no run
folder), given what BaseTrainer.setup gives them: the family's config class with its defaults (batch, imgsz,
num_classes and nbs from the command), the device, the network, `on_setup` (the criterion; YOLOX's bias priors),
`_setup_optimizer`, a GradScaler under AMP (float16, on CUDA only: float32 on a CPU), ModelEMA (the config's decay,
tau 2000) and, for `graph`, the TrainGraphManager that `cuda_graph=True` starts; `_forward_train` then asks the
family for its capture spec. One step is BaseTrainer._train_epoch's body for one batch (D-FINE's _train_epoch is the
same steps): the pinned batch copied to the device, the forward and loss under autocast through `_forward_train`,
zero_grad, the scaled backward, the gradient norm clipped where clip_max_norm > 0 (unscaled first), the scaler step
and update (or the plain step), the EMA update. With accumulate = round(nbs / batch) > 1 it is _train_epoch_accum's
body: zero_grad(set_to_none) at the window's start, loss / accumulate, the clip, step and EMA once per window. nbs
defaults to what `bench step` resolves for our model (auto: 64), so both accumulate alike; 1.6's configs leave nbs
unset (an optimizer step every batch): --nbs 0.

D-FINE (--family dfine; sizes n s m, those this project has; 1.6 has l and x too): DFINETrainer's `_forward_train`
(on_forward: the padded pixel targets to per-image normalised cx, cy, w, h dicts, LibreDFINEModel's forward with
them, so the decoder builds its contrastive denoising queries (100, label noise 0.5, box noise 1.0) from them, then
`build_criterion`'s DFINECriterion: Hungarian matching, VFL, L1, GIoU, FGL, DDF over the main, auxiliary, pre,
encoder and denoising outputs); clip 0.1 over all the model's parameters. Optimizer: DFINETrainer._setup_optimizer's
AdamW (betas 0.9, 0.999; fused on CUDA via 1.6's build_optimizer) at 2e-4, weight decay 1e-4, four groups: backbone
at 0.5x lr, and no decay on names holding norm, bn, bias or lab.scale. EMA 0.9999. The network is built as when 1.6
fine-tunes from weights, its HGNetv2 stem frozen (pretrained=False would train it too); the batch is RGB in [0, 1] as
float32 with targets padded to 120 rows. `graph`: DETREncoderCudaGraphMixin.cuda_graph_train_spec, the backbone and
encoder captured while the decoder (its denoising queries change with the boxes per image) and the criterion run
eagerly. It cannot run below 128 px (s, m) or 256 px (n): its encoder keeps 300 top tokens.

YOLOv9 (--family yolo9; sizes t s m c): YOLO9Trainer's on_forward, LibreYOLO9Model's training forward with the
targets: backbone, neck and main head, and the PGI auxiliary branch (AuxNeck and a second DDetect head) that
LibreYOLO9.train attaches before setup by default (aux_weight 0.25, YOLO9Config), then per head YOLO9Loss: Vec2Box,
the task-aligned assigner over all 300 target rows, BCE, CIoU and DFL, the auxiliary loss added at 0.25. Optimizer:
BaseTrainer._setup_optimizer's SGD at 0.01, momentum 0.937, Nesterov, three groups (weights at weight decay 5e-4;
BatchNorm weights and biases without); no clipping (YOLO9Config sets none); EMA 0.9999. The batch is RGB in [0, 1]
as float32 with targets class, x1, y1, x2, y2 normalised, padded to 300 rows (max_labels) with class -1. `graph`:
YOLO9Trainer.cuda_graph_train_spec, the whole network with both heads (_PGITrainForward) captured, the two losses
eager.

YOLOX (--family yolox; sizes n t s m l x): YOLOXTrainer's on_forward, LibreYOLOXModel's training forward (YOLOPAFPN,
the decoupled head, BatchNorm eps 1e-3) and YOLOXHead.get_losses: SimOTA's dynamic-k assignment image by image, IoU,
objectness and class BCE; no L1 term (1.6 adds it only once mosaic closes for the last epochs). Optimizer: SGD at
0.01, momentum 0.9, Nesterov, the same three groups at weight decay 5e-4; no clipping; EMA 0.9998. The batch is BGR
in 0-255 as float32 (YOLOX's own input) with targets class, cx, cy, w, h in pixels padded with zero rows to 50
(YOLOXTrainer's max_labels; rows past 50 are dropped, as its transform drops them). `graph`:
YOLOXTrainer.cuda_graph_train_spec, backbone, head convolutions and decode (forward_train_maps) captured, SimOTA and
the loss eager.

RT-DETR (--family rtdetr; sizes r18 r34 r50 r101, those this project has; 1.6 also has r50m and the HGNetv2 l and
x): RTDETRTrainer's on_forward: convert_targets_for_detr (per-image normalised cx, cy, w, h dicts), RTDETRModel's
forward with them (PResNet-vd, HybridEncoder, RTDETRTransformer with its contrastive denoising queries: 100, label
noise 0.5, box noise 1.0) and RTDETRLoss: Hungarian matching (scipy, on the host), VFL, L1, GIoU over the main,
auxiliary and denoising outputs. Optimizer: RTDETRTrainer._setup_optimizer's AdamW (betas 0.9, 0.999; fused on
CUDA) at 1e-4, the backbone at 5e-6, weight decay 1e-4, no decay on the backbone's norms and the encoder's and
decoder's norms and biases; the gradient norm clipped to 0.1 (BaseTrainer._clip_gradients, over the optimizer's
parameters that have a gradient); EMA 0.9999. The network is LibreRTDETR._init_model's as when 1.6 loads weights to
fine-tune (no backbone download): the stem frozen (freeze_at 0), and r50's and r101's backbone BatchNorms frozen
(FrozenBatchNorm2d). The batch is RGB in [0, 1] as float32 with targets class, x1, y1, x2, y2 normalised, padded to
300 rows with class -1. `graph`: as D-FINE's, the backbone and encoder captured. Below 128 px its encoder has fewer
tokens than its 300 queries, and the script says so.

Left out, in 1.6's favour, for every family: the data loader (its mosaic and transforms on the host, D-FINE's
multi-scale collate), the progress bar and the per-step loss logging (the `.item()` of the total and
get_loss_components' transfer, one device synchronisation each per step in 1.6), the LR schedule's per-step update
(and YOLOv9's momentum warm-up)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch


@dataclass(frozen=True)
class Family:
    prefix: str  # this project's model name prefix (LibreRTMDet + size)
    tag: str  # the JSON line's model name, as 1.6's get_model_tag says it
    sizes: tuple[str, ...]  # the sizes both have
    default: str


FAMILIES = {
    "rtmdet": Family("LibreRTMDet", "RTMDet", ("t", "s", "m", "l", "x"), "t"),
    "dfine": Family("LibreDFINE", "DFINE", ("n", "s", "m"), "s"),
    "yolo9": Family("LibreYOLO9", "YOLOv9", ("t", "s", "m", "c"), "t"),
    "yolox": Family("LibreYOLOX", "YOLOX", ("n", "t", "s", "m", "l", "x"), "n"),
    "rtdetr": Family("LibreRTDETR", "RT-DETR", ("r18", "r34", "r50", "r101"), "r18"),
}


@dataclass
class Run:
    step: Callable[[], None]
    manager: Any  # 1.6's TrainGraphManager, None in eager
    accumulate: int
    extra: dict[str, Any]


def build(family: str, a: Any, rec: dict, device: torch.device, mode: str) -> Run:
    """1.6's step for `family` on the saved batch `rec` (img, targets, mask, nc, nbs)."""
    return {"rtmdet": _rtmdet, "dfine": _dfine, "yolo9": _yolo9, "yolox": _yolox, "rtdetr": _rtdetr}[family](
        a, rec, device, mode
    )


# --- the batch as 1.6's loaders hand it over (ours: NHWC uint8 RGB; targets class, x1, y1, x2, y2 in pixels)


def _xywh_targets(rec: dict) -> torch.Tensor:
    """Our x1, y1, x2, y2 pixel targets as 1.6's (B, M, 5) class, centre x, y, width, height, zero rows padding."""
    t = rec["targets"]
    xywh = torch.cat((t[..., :1], (t[..., 1:3] + t[..., 3:5]) / 2, t[..., 3:5] - t[..., 1:3]), -1)
    return torch.where(rec["mask"][..., None], xywh, 0.0)


def _normalised_xyxy(rec: dict) -> torch.Tensor:
    """(B, M, 5) class, x1, y1, x2, y2 in [0, 1], empty rows class -1 and zero boxes (YOLOv9's, RT-DETR's)."""
    h, w = rec["img"].shape[1:3]
    t = rec["targets"] / torch.tensor([1.0, w, h, w, h])
    return torch.where(rec["mask"][..., None], t, torch.tensor([-1.0, 0, 0, 0, 0]))


def _rows(t: torch.Tensor, rows: int, fill: float = 0.0) -> torch.Tensor:
    """Targets padded (class `fill`, zero box) or cut to `rows` per image, as 1.6's transform's max_labels."""
    if t.shape[1] >= rows:
        return t[:, :rows].contiguous()
    pad = torch.zeros(t.shape[0], rows - t.shape[1], t.shape[2])
    pad[..., 0] = fill
    return torch.cat((t, pad), 1)


def _rgb01(rec: dict) -> torch.Tensor:
    return (rec["img"].permute(0, 3, 1, 2).float() / 255).contiguous()


def _tokens_check(decoder: Any, imgsz: int, name: str) -> None:
    """A DETR encoder picks num_queries tokens out of every level's cells (topk: at least that many)."""
    if sum(((imgsz + st - 1) // st) ** 2 for st in decoder.feat_strides) < decoder.num_queries:
        raise SystemExit(
            f"1.6's {name} cannot train at {imgsz} px: fewer tokens than its {decoder.num_queries} queries"
        )


# --- the trainer families: 1.6's own methods on a trainer made without __init__ (the module docstring)


def _trainer_run(tr: Any, cfg: Any, model: torch.nn.Module, device: torch.device, mode: str, img, targets, clip=None):
    """BaseTrainer.setup's parts that the step reads, then its step for one batch -> Run."""
    from libreyolo.training.cuda_graph import TrainGraphManager
    from libreyolo.training.ema import ModelEMA
    from libreyolo.utils.amp import amp_uses_grad_scaler

    cuda = device.type == "cuda"
    tr.config, tr.device, tr.wrapper_model = cfg, device, None
    tr.model = model = model.to(device).train()
    tr.on_setup()
    tr.optimizer = opt = tr._setup_optimizer()
    use_amp = cfg.amp and cuda  # BaseTrainer: AMP (and its scaler) on CUDA only
    scaler = tr.scaler = torch.amp.GradScaler("cuda", enabled=amp_uses_grad_scaler(cfg.amp_dtype)) if use_amp else None
    ema = tr.ema_model = ModelEMA(model, decay=cfg.ema_decay, tau=getattr(cfg, "ema_tau", 2000)) if cfg.ema else None
    accumulate = tr._accum_steps
    # BaseTrainer._start_cuda_graph_manager: cuda_graph=True; _forward_train asks the family for its spec
    manager = tr._cuda_graph_manager = (
        TrainGraphManager(preserve_accumulated_grads=accumulate > 1) if mode == "graph" else None
    )
    max_norm = float(getattr(cfg, "clip_max_norm", 0.0) or 0.0)
    clip = clip or tr._clip_gradients
    if cuda:
        img, targets = img.pin_memory(), targets.pin_memory()
    n = 0

    def step() -> None:
        nonlocal n
        imgs = img.to(device, non_blocking=True)
        tg = targets.to(device, non_blocking=True)
        if accumulate > 1 and n % accumulate == 0:
            opt.zero_grad(set_to_none=True)
        n += 1
        with tr._autocast_context() if scaler is not None else nullcontext():
            loss = tr._forward_train(imgs, tg, None)["total_loss"]
            if accumulate > 1:
                loss = loss / accumulate
        if accumulate == 1:
            opt.zero_grad()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if n % accumulate:
            return
        if max_norm > 0:
            if scaler is not None:
                scaler.unscale_(opt)
            clip()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if ema is not None:
            ema.update(model)

    extra = {
        "nbs": cfg.nbs,
        "amp": use_amp,
        "optimizer": cfg.optimizer,
        "lr0": cfg.lr0,
        "weight_decay": cfg.weight_decay,
        "clip_max_norm": max_norm,
        "ema_decay": cfg.ema_decay if cfg.ema else None,
        "params": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    return Run(step, manager, accumulate, extra)


def _config(cls: Any, a: Any, rec: dict) -> Any:
    return cls(size=a.size, num_classes=rec["nc"], batch=a.batch, imgsz=a.imgsz, nbs=rec["nbs"] or None)


def _dfine(a: Any, rec: dict, device: torch.device, mode: str) -> Run:
    from libreyolo.models.dfine.nn import LibreDFINEModel
    from libreyolo.models.dfine.trainer import DFINETrainer
    from libreyolo.training.config import DFINEConfig

    cfg = _config(DFINEConfig, a, rec)
    model = LibreDFINEModel(a.size, rec["nc"])  # as from weights: stem frozen
    _tokens_check(model.decoder, a.imgsz, f"D-FINE-{a.size}")
    targets = _rows(_xywh_targets(rec), 120)
    max_norm = float(cfg.clip_max_norm)
    clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # noqa: E731  (DFINETrainer's own)
    return _trainer_run(DFINETrainer.__new__(DFINETrainer), cfg, model, device, mode, _rgb01(rec), targets, clip)


def _yolo9(a: Any, rec: dict, device: torch.device, mode: str) -> Run:
    from libreyolo.models.yolo9.nn import LibreYOLO9Model
    from libreyolo.models.yolo9.trainer import YOLO9Trainer
    from libreyolo.training.config import YOLO9Config

    cfg = _config(YOLO9Config, a, rec)
    model = LibreYOLO9Model(config=a.size, reg_max=16, nb_classes=rec["nc"])
    if cfg.aux_weight > 0:  # LibreYOLO9.train attaches the PGI branch before the trainer's setup
        model.enable_aux(weight=cfg.aux_weight)
    targets = _rows(_normalised_xyxy(rec), cfg.max_labels, -1.0)
    run = _trainer_run(YOLO9Trainer.__new__(YOLO9Trainer), cfg, model, device, mode, _rgb01(rec), targets)
    run.extra["aux_weight"] = cfg.aux_weight
    return run


def _yolox(a: Any, rec: dict, device: torch.device, mode: str) -> Run:
    from libreyolo.models.yolox.nn import LibreYOLOXModel
    from libreyolo.models.yolox.trainer import YOLOXTrainer
    from libreyolo.training.config import YOLOXConfig

    cfg = _config(YOLOXConfig, a, rec)
    model = LibreYOLOXModel(config=a.size, nb_classes=rec["nc"])
    img = rec["img"].permute(0, 3, 1, 2).flip(1).float().contiguous()  # BGR, 0-255
    targets = _rows(_xywh_targets(rec), 50)
    return _trainer_run(YOLOXTrainer.__new__(YOLOXTrainer), cfg, model, device, mode, img, targets)


def _rtdetr(a: Any, rec: dict, device: torch.device, mode: str) -> Run:
    from libreyolo.models.rtdetr.config import RTDETRConfig
    from libreyolo.models.rtdetr.model import LibreRTDETR
    from libreyolo.models.rtdetr.trainer import RTDETRTrainer

    cfg = _config(RTDETRConfig, a, rec)
    # LibreRTDETR._init_model as when weights are loaded: no backbone download, 1.6's fine-tune freezing
    wrapper = SimpleNamespace(
        size=a.size, nb_classes=rec["nc"], _loading_from_weights=True, _is_scratch_build=lambda: False
    )
    model = LibreRTDETR._init_model(wrapper)
    _tokens_check(model.decoder, a.imgsz, f"RT-DETR-{a.size}")
    targets = _rows(_normalised_xyxy(rec), 300, -1.0)
    return _trainer_run(RTDETRTrainer.__new__(RTDETRTrainer), cfg, model, device, mode, _rgb01(rec), targets)


# --- RTMDet: 1.6's step written out (the published RTMDet rows in docs/performance.md were measured with it)


def _rtmdet(a: Any, rec: dict, device: torch.device, mode: str) -> Run:
    from libreyolo.models.rtmdet.loss import RTMDetLoss
    from libreyolo.models.rtmdet.nn import LibreRTMDetModel
    from libreyolo.training.cuda_graph import CudaGraphTrainSpec, GraphableNetwork, TrainGraphManager
    from libreyolo.training.ema import ModelEMA

    cuda = device.type == "cuda"
    accumulate = max(round(rec["nbs"] / a.batch), 1)
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

    extra = {"params": sum(p.numel() for p in model.parameters())}
    return Run(step, manager, accumulate, extra)
