"""YOLOX's implementation: network, SimOTA loss, postprocess, YOLOX's warm-up + cosine schedule, and the hook that
switches the L1 term on when mosaic closes."""

from __future__ import annotations

import math

import torch
from torch import nn

from libreyolo.families import RunKeys
from libreyolo.families.base import FamilyImpl, HookContext, Reduce, own, random_output
from libreyolo.families.yolox import FAMILY
from libreyolo.families.yolox.loss import YOLOXLoss
from libreyolo.families.yolox.network import YOLOX
from libreyolo.families.yolox.postprocess import postprocess


def build(size: str, nc: int) -> YOLOX:
    return YOLOX(size, nc)


def train_net(net: nn.Module, cfg: RunKeys) -> nn.Module:
    return net  # no training-only heads: the step runs the detector itself


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> torch.Tensor:
    """Random raw head outputs: (batch, anchors, 5 + nc)."""
    net = own(train, YOLOX)
    anchors = sum(h * w for h, w in net.feature_shapes(*imgsz))
    return random_output((batch, anchors, 5 + net.nc), dtype, device)


def loss(net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None) -> YOLOXLoss:
    net = own(net, YOLOX)
    k = FAMILY.options_of(cfg)
    return YOLOXLoss(net.nc, net.strides, k.box, k.obj, k.cls, k.l1, reduce_normalizer=reduce_normalizer)


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
    cfg: RunKeys,
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


def on_mosaic_close(ctx: HookContext) -> None:
    """YOLOX adds the L1 term for the epochs without mosaic: switch it on in the training and validation
    losses, and drop any graph captured without it (it is captured anew once stable)."""
    for fn in ctx.losses:
        fn.use_l1 = True
    ctx.invalidate(f"L1 loss on at epoch {ctx.epoch + 1}")


IMPL = FamilyImpl(
    build=build,
    train_net=train_net,
    loss=loss,
    postprocess=postprocess,
    schedule=schedule,
    hooks={"mosaic_close": on_mosaic_close},
    example_outputs=example_outputs,
)

__all__ = ["IMPL", "YOLOX", "YOLOXLoss"]
