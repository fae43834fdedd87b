"""RT-DETR (ResNet-vd backbone + hybrid encoder + query-selection decoder with deformable attention and contrastive
denoising; Hungarian matching on the host, so `cuda_graph=true` captures the backbone and encoder only and the whole
step is never captured): the family's description. The implementation is impl.py, imported on first use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo import keys as K
from libreyolo.families import CapturePlan, Family, register

WHY_NOT_FULL = (
    "RT-DETR's Hungarian matching runs on the host (scipy) and its denoising queries change shape with the boxes "
    "per image, so its whole step cannot be one graph"
)


@dataclass(frozen=True)
class RtdetrKeys:
    num_queries: int = K.option(300, K.positive(K.integer), "decoder queries (top-k encoder tokens) per image")
    num_denoising: int = K.option(100, K.nonneg(K.integer), "denoising queries per image in training (0: none)")
    label_noise: float = K.option(
        0.5, K.nonneg(K.number), "denoising: a copy's class is random with probability label_noise/2"
    )
    box_noise: float = K.option(1.0, K.nonneg(K.number), "denoising: box noise scale (in half box sizes)")
    vfl: float = K.option(1.0, K.nonneg(K.number), "varifocal classification loss gain")
    bbox: float = K.option(5.0, K.nonneg(K.number), "L1 box loss gain (normalised cx, cy, w, h)")
    giou: float = K.option(2.0, K.nonneg(K.number), "generalized IoU box loss gain")
    backbone_lr: float = K.option(0.1, K.nonneg(K.number), "the backbone's learning rate as a fraction of lr0")


# RT-DETR's recipe where it differs from the shared defaults: AdamW at 1e-4 (backbone x0.1: backbone_lr), weight
# decay 1e-4, gradient norm clipped to 0.1, EMA 0.9999 over 2000 warm-up updates, a linear LR warm-up, then a flat
# LR (lrf=1: its 6x schedule never reaches its step). No mosaic (its pipeline has none); the shared random
# scale/translate/flip/HSV stand in for its zoom-out, IoU crop, flip and photometric distortion. nbs=16 is its
# total batch: a smaller batch accumulates to it, a larger one steps every batch.
DEFAULTS: dict[str, Any] = {
    "optimizer": "AdamW",
    "lr0": 1e-4,
    "lrf": 1.0,
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "grad_clip": 0.1,
    "ema": True,
    "ema_decay": 0.9999,
    "ema_tau": 2000.0,
    "warmup_epochs": 1.0,
    "warmup_bias_lr": 0.0,
    "warmup_momentum": 0.9,
    "nbs": 16,
    "mosaic": 0.0,
    "scale": 0.5,
    "translate": 0.1,
    "amp": True,
}


FAMILY = register(
    Family(
        name="rtdetr",
        prefix="LibreRTDETR",
        sizes=("r18", "r34", "r50", "r101"),
        task="detect",
        loss_terms=("vfl", "bbox", "giou"),
        impl="libreyolo.families.rtdetr.impl",
        options=RtdetrKeys,
        # the decoder's query count (denoising groups) changes per batch and the matching runs on the host: only
        # the backbone + encoder (`features`) are captured
        capture=CapturePlan(("features",), full_step=False, why_not_full=WHY_NOT_FULL),
        supports_ddp=False,
        defaults=DEFAULTS,
        order=2,
        backbone=("features.backbone",),
        convert="libreyolo.families.rtdetr.convert",
        export="libreyolo.families.rtdetr.export",
        published=(
            "Official RT-DETR (v1) .pth files are published at github.com/lyuwenyu/RT-DETR (rtdetr_pytorch's model "
            "zoo) and LibreYOLO 1.6's at huggingface.co/LibreYOLO; torchvision's ImageNet ResNet weights "
            "(torchvision.models.ResNet50_Weights etc.) load into RT-DETR's backbone with pretrained="
        ),
    )
)
