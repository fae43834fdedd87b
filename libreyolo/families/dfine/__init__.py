"""D-FINE (HGNetv2 backbone + RT-DETR's hybrid encoder with GELAN blocks + a decoder that refines each box edge as
a distribution over bins, with the last layer distilling into the earlier ones; Hungarian matching on the host, so
`cuda_graph=true` captures the backbone and encoder only and the whole step is never captured): the family's
description. The implementation is impl.py, imported on first use. Much of it is RT-DETR's (families/rtdetr)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo import keys as K
from libreyolo.families import CapturePlan, Family, register

WHY_NOT_FULL = (
    "D-FINE's Hungarian matching runs on the host (scipy) and its denoising queries change shape with the boxes "
    "per image, so its whole step cannot be one graph"
)


@dataclass(frozen=True)
class DfineKeys:
    num_queries: int = K.option(300, K.positive(K.integer), "decoder queries (top-k encoder tokens) per image")
    num_denoising: int = K.option(100, K.nonneg(K.integer), "denoising queries per image in training (0: none)")
    label_noise: float = K.option(
        0.5, K.nonneg(K.number), "denoising: a copy's class is random with probability label_noise/2"
    )
    box_noise: float = K.option(1.0, K.nonneg(K.number), "denoising: box noise scale (in half box sizes)")
    vfl: float = K.option(1.0, K.nonneg(K.number), "varifocal classification loss gain")
    bbox: float = K.option(5.0, K.nonneg(K.number), "L1 box loss gain (normalised cx, cy, w, h)")
    giou: float = K.option(2.0, K.nonneg(K.number), "generalized IoU box loss gain")
    fgl: float = K.option(0.15, K.nonneg(K.number), "fine-grained localisation (edge distribution) loss gain")
    ddf: float = K.option(1.5, K.nonneg(K.number), "distillation gain (earlier layers' edges towards the last's)")
    dn_pad: int = K.option(
        0,
        K.nonneg(K.integer),
        "pad the denoising queries to this count (0: no padding): one decoder shape whatever the boxes per image",
    )
    backbone_lr: float = K.option(0.5, K.nonneg(K.number), "the backbone's learning rate as a fraction of lr0")


# D-FINE's recipe where it differs from the shared defaults: AdamW at 2e-4 (backbone x0.5: backbone_lr), weight
# decay 1e-4, gradient norm clipped to 0.1, EMA 0.9999 over 2000 warm-up updates, a linear LR warm-up then a flat LR,
# no mosaic; nbs=32 is its total batch. amp=False: the decoder clamps its activations to float16's largest finite
# value (65504) before the last norm of every layer, and its distribution heads' logits are summed across layers, so
# under float16 they sit at the edge of the range; the seeds' D-FINE runs train in float32 by default.
DEFAULTS: dict[str, Any] = {
    "optimizer": "AdamW",
    "lr0": 2e-4,
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
    "nbs": 32,
    "mosaic": 0.0,
    "scale": 0.5,
    "translate": 0.1,
    "amp": False,
}


FAMILY = register(
    Family(
        name="dfine",
        prefix="LibreDFINE",
        sizes=("n", "s", "m"),
        task="detect",
        loss_terms=("vfl", "bbox", "giou", "fgl", "ddf"),
        impl="libreyolo.families.dfine.impl",
        options=DfineKeys,
        capture=CapturePlan(("features",), full_step=False, why_not_full=WHY_NOT_FULL),
        supports_ddp=False,
        defaults=DEFAULTS,
        order=3,
        backbone=("features.backbone",),
        convert="libreyolo.families.dfine.convert",
        export="libreyolo.families.dfine.export",
        published=(
            "the official D-FINE weights (github.com/Peterande/D-FINE releases, dfine_hgnetv2_{n,s,m}_coco.pth) and "
            "LibreYOLO 1.6's LibreDFINE{n,s,m}.pt load by file"
        ),
    )
)
