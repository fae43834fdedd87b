"""YOLOX (CSPDarknet + PAFPN + decoupled anchor-free head, SimOTA assignment, IoU/obj/cls loss with an L1 term
switched on when mosaic closes, YOLOX's warm-up + cosine LR schedule): the family's description. The implementation
is impl.py, imported on first use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo import keys as K
from libreyolo.families import WHOLE_NET, Family, register


@dataclass(frozen=True)
class YoloxKeys:
    box: float = K.option(5.0, K.nonneg(K.number), "IoU (1 - IoU^2) box loss gain")
    obj: float = K.option(1.0, K.nonneg(K.number), "objectness (BCE) loss gain")
    cls: float = K.option(1.0, K.nonneg(K.number), "classification (BCE, IoU-aware targets) loss gain")
    l1: float = K.option(1.0, K.nonneg(K.number), "L1 loss gain on the raw box outputs (on once mosaic closes)")


# YOLOX's own training recipe where it differs from the shared defaults (mixup is not in our pipeline); lrf is
# YOLOX's min_lr_ratio: the cosine ends at 5% of lr0 and stays there for the no-aug epochs (a share of them in a
# run shorter than YOLOX's 300 epochs: lr_phases)
# Except the optimizer: YOLOX's SGD at 0.01 per 64 images is tuned for 300 epochs and hardly learns in a short run
# (dense scenes, 15 epochs, mAP50-95 of YOLOX-s on CPU: SGD 0.016, AdamW at 0.001 / 0.002 / 0.004: 0.043 / 0.084 /
# 0.079, LibreYOLO9s 0.085; docs/families.md). optimizer=SGD lr0=0.01 is YOLOX's recipe for long runs.
# And rotation and shear: YOLOX's recipe rotates (10 degrees) and shears (2) only inside its mosaic epochs, and this
# pipeline's affine runs in every epoch, so a short run (no mosaic epoch) rotated every image where YOLOX's own
# run rotates none. With the shared defaults (no rotation, no shear) YOLOX-s went from 80% to 97% of LibreYOLO9s'
# mAP50-95 on a dense set and from 0.69 to 0.93 on the sparse one (docs/performance.md); pass degrees=10 shear=2
# for YOLOX's recipe in long runs with mosaic.
DEFAULTS: dict[str, Any] = {
    "optimizer": "AdamW",
    "lr0": 0.002,
    "lrf": 0.05,
    "momentum": 0.9,
    "weight_decay": 0.0005,
    "ema_decay": 0.9998,
    "warmup_epochs": 5,
    "no_aug_epochs": 15,
    "scale": 0.5,
    "amp": True,
    "sync_bn": True,
}


FAMILY = register(
    Family(
        name="yolox",
        prefix="LibreYOLOX",
        sizes=("n", "t", "s", "m", "l", "x"),
        task="detect",
        loss_terms=("iou", "obj", "cls", "l1"),
        impl="libreyolo.families.yolox.impl",
        options=YoloxKeys,
        capture=WHOLE_NET,
        supports_ddp=True,
        defaults=DEFAULTS,
        order=1,
        backbone=("backbone",),
        convert="libreyolo.families.yolox.convert",
        export="libreyolo.families.yolox.export",
        published=(
            "the official YOLOX weights are release assets of github.com/Megvii-BaseDetection/YOLOX (yolox_nano.pth "
            "... yolox_x.pth); LibreYOLO 1.6's at huggingface.co/LibreYOLO (LibreYOLOXs and the other sizes)"
        ),
    )
)
