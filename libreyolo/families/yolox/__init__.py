"""YOLOX family spec: CSPDarknet + PAFPN + decoupled anchor-free head, SimOTA assignment, IoU/obj/cls loss
with an L1 term switched on when mosaic closes, and YOLOX's warm-up + cosine LR schedule."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from libreyolo import keys as K
from libreyolo.families import WHOLE_NET, Family, Reduce, own, random_output, register
from libreyolo.families.yolox.loss import YOLOXLoss
from libreyolo.families.yolox.network import SIZES, YOLOX
from libreyolo.families.yolox.postprocess import postprocess

NAME = "yolox"
LOSS_TERMS = ("iou", "obj", "cls", "l1")

KEYS = (
    K.Key("box", 5.0, K.nonneg(K.number), "IoU (1 - IoU^2) box loss gain"),
    K.Key("obj", 1.0, K.nonneg(K.number), "objectness (BCE) loss gain"),
    K.Key("cls", 1.0, K.nonneg(K.number), "classification (BCE, IoU-aware targets) loss gain"),
    K.Key("l1", 1.0, K.nonneg(K.number), "L1 loss gain on the raw box outputs (on once mosaic closes)"),
)

# YOLOX's own training recipe where it differs from the shared defaults (mixup is not in our pipeline); lrf is
# YOLOX's min_lr_ratio: the cosine ends at 5% of lr0 and stays there for the no-aug epochs (a share of them in a
# run shorter than YOLOX's 300 epochs: lr_phases)
# Except the optimizer: YOLOX's SGD at 0.01 per 64 images is tuned for 300 epochs and hardly learns in a short run
# (dense scenes, 15 epochs, mAP50-95 of YOLOX-s on CPU: SGD 0.016, AdamW at 0.001 / 0.002 / 0.004: 0.043 / 0.084 /
# 0.079, LibreYOLO9s 0.085; docs/families.md). optimizer=SGD lr0=0.01 is YOLOX's recipe for long runs.
DEFAULTS: dict[str, Any] = {
    "optimizer": "AdamW",
    "lr0": 0.002,
    "lrf": 0.05,
    "momentum": 0.9,
    "weight_decay": 0.0005,
    "ema_decay": 0.9998,
    "warmup_epochs": 5,
    "no_aug_epochs": 15,
    "degrees": 10.0,
    "shear": 2.0,
    "scale": 0.5,
    "amp": True,
    "sync_bn": True,
}


def build(size: str, nc: int) -> YOLOX:
    return YOLOX(size, nc)


def train_net(net: nn.Module, cfg: Any) -> nn.Module:
    return net  # no training-only heads: the step runs the detector itself


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> torch.Tensor:
    """Random raw head outputs: (batch, anchors, 5 + nc)."""
    net = own(train, YOLOX)
    anchors = sum(h * w for h, w in net.feature_shapes(*imgsz))
    return random_output((batch, anchors, 5 + net.nc), dtype, device)


def loss(net: nn.Module, cfg: Any, reduce_normalizer: Reduce | None = None) -> YOLOXLoss:
    net = own(net, YOLOX)
    # a config built for another family (`model.val()` builds one without the model's family) has no YOLOX
    # gains, or another family's under the same name: use YOLOX's defaults then
    is_own = getattr(cfg, "family", None) == NAME
    g = {k.name: float(getattr(cfg, k.name)) if is_own else float(k.default) for k in KEYS}
    return YOLOXLoss(net.nc, net.strides, g["box"], g["obj"], g["cls"], g["l1"], reduce_normalizer=reduce_normalizer)


def warm_cos_factor(ni: int, total: int, warmup: int, no_aug: int, min_ratio: float = 0.05) -> float:
    """YOLOX's yoloxwarmcos as a multiplier of lr0 at global iteration ni: quadratic rise from 0 over `warmup`
    iterations, cosine down to min_ratio until the last `no_aug` iterations, then min_ratio."""
    if warmup > 0 and ni <= warmup:
        return (ni / warmup) ** 2
    if ni >= total - no_aug:
        return min_ratio
    span = max(total - warmup - no_aug, 1)
    return min_ratio + 0.5 * (1.0 - min_ratio) * (1.0 + math.cos(math.pi * (ni - warmup) / span))


RECIPE_EPOCHS = 300  # YOLOX's recipe: 5 warm-up epochs, a cosine, then its floor for the last 15 (no-aug) epochs
MIN_WARMUP = 100  # iterations: the engine's floor for any warm-up (engine/setup.py), kept when a run is scaled


def lr_phases(epochs: int, steps_per_epoch: int, warmup_iters: int, no_aug_epochs: int) -> tuple[int, int]:
    """(warm-up, floor) lengths in iterations for warm_cos_factor. YOLOX spends 5/300 of its run warming up and
    15/300 at the floor; with the same epoch counts a short run would warm up for a third of a 15-epoch run and
    then, its no-aug epochs covering it all, sit at the floor (5% of lr0) for the rest: it barely learns. So a
    run shorter than YOLOX's 300 epochs scales both phases by epochs / 300, the warm-up not below MIN_WARMUP
    iterations (nor above what was asked); a run of 300 epochs or more follows YOLOX's recipe as configured."""
    share = min(epochs / RECIPE_EPOCHS, 1.0)
    warmup = max(round(warmup_iters * share), min(warmup_iters, MIN_WARMUP))
    floor = round(min(no_aug_epochs, epochs) * steps_per_epoch * share)
    return warmup, floor


def schedule(
    optimizer: torch.optim.Optimizer,
    cfg: Any,
    epoch: int,
    ni: int,
    warmup_iters: int,
    momentum: float,
    steps_per_epoch: int,
) -> None:
    """Every group follows the same curve (YOLOX has no bias warm-up), down to lrf * lr0; momentum stays constant."""
    warmup, floor = lr_phases(cfg.epochs, steps_per_epoch, warmup_iters, cfg.no_aug_epochs)
    f = warm_cos_factor(ni, cfg.epochs * steps_per_epoch, warmup, floor, cfg.lrf)
    for g in optimizer.param_groups:
        g["lr"] = g["initial_lr"] * f
        if "momentum" in g:
            g["momentum"] = momentum
        elif "betas" in g:
            g["betas"] = (momentum, g["betas"][1])


def on_mosaic_close(trainer: Any) -> None:
    """YOLOX adds the L1 term for the epochs without mosaic: switch it on in the training and validation
    losses, and have the step runner drop any graph captured without it (it re-captures once stable)."""
    s = trainer.s
    for fn in (s.loss_fn, s.val_loss):
        fn.use_l1 = True
    s.step.invalidate(f"L1 loss on at epoch {trainer.epoch + 1}")


FAMILY = register(
    Family(
        name=NAME,
        prefix="LibreYOLOX",
        sizes=tuple(SIZES),
        task="detect",
        build=build,
        train_net=train_net,
        loss=loss,
        postprocess=postprocess,
        loss_terms=LOSS_TERMS,
        keys=KEYS,
        capture=WHOLE_NET,
        supports_ddp=True,
        defaults=DEFAULTS,
        schedule=schedule,
        hooks={"on_mosaic_close": on_mosaic_close},
        example_outputs=example_outputs,
    )
)

__all__ = ["FAMILY", "YOLOX", "YOLOXLoss"]
