"""RTMDet (CSPNeXt backbone + CSPNeXt PAFPN + a head with convolutions shared across levels and BatchNorm per level,
dynamic soft label assignment, quality focal loss + GIoU): the family's description. The implementation is impl.py,
imported on first use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo import keys as K
from libreyolo.families import WHOLE_NET, Family, register


@dataclass(frozen=True)
class RtmdetKeys:
    qfl: float = K.option(1.0, K.nonneg(K.number), "quality focal loss (classification, IoU-aware targets) gain")
    box: float = K.option(2.0, K.nonneg(K.number), "GIoU box loss gain (RTMDet: 2)")


# RTMDet's recipe (mmdetection's rtmdet_*_8xb32-300e_coco) where it differs from the shared defaults: AdamW at 0.004
# with weight decay 0.05 (none on norms and biases: the engine's default groups), a linear warm-up, then a cosine
# down to 5% of the LR, EMA 0.9998, the last 20 epochs without mosaic. Its schedule is flat for the first half and
# cosine over the second; here the cosine spans the run (cos_lr). Its mixup and large-scale jitter (0.1-2.0) are
# not in the pipeline; scale=0.5 is the shared random scale's stand-in.
DEFAULTS: dict[str, Any] = {
    "optimizer": "AdamW",
    "lr0": 0.004,
    "lrf": 0.05,
    "cos_lr": True,
    "momentum": 0.9,
    "weight_decay": 0.05,
    "warmup_bias_lr": 0.0,
    "warmup_momentum": 0.9,
    "ema_decay": 0.9998,
    "no_aug_epochs": 20,
    "scale": 0.5,
    "amp": True,
    "sync_bn": True,
}


FAMILY = register(
    Family(
        name="rtmdet",
        prefix="LibreRTMDet",
        sizes=("t", "s", "m", "l", "x"),
        task="detect",
        loss_terms=("qfl", "box"),
        impl="libreyolo.families.rtmdet.impl",
        options=RtmdetKeys,
        capture=WHOLE_NET,
        supports_ddp=True,
        defaults=DEFAULTS,
        order=5,
        backbone=("backbone",),
        convert="libreyolo.families.rtmdet.convert",
        export="libreyolo.families.rtmdet.export",
        published=(
            "the official RTMDet weights are in mmdetection's model zoo (github.com/open-mmlab/mmdetection, "
            "configs/rtmdet: rtmdet_tiny_8xb32-300e_coco_*.pth ... rtmdet_x_*.pth); LibreYOLO 1.6's at "
            "huggingface.co/LibreYOLO (LibreRTMDett and the other sizes)"
        ),
    )
)
