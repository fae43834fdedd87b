"""YOLOv9 (GELAN network, auxiliary PGI head while training, TAL/CIoU/DFL loss): the family's description. The
implementation is impl.py, imported on first use."""

from __future__ import annotations

from dataclasses import dataclass

from libreyolo import keys as K
from libreyolo.families import WHOLE_NET, Family, register


@dataclass(frozen=True)
class Yolo9Keys:
    box: float = K.option(7.5, K.nonneg(K.number), "box (CIoU) loss gain")
    cls: float = K.option(0.5, K.nonneg(K.number), "classification (BCE) loss gain")
    dfl: float = K.option(1.5, K.nonneg(K.number), "distribution focal loss gain")
    aux: bool = K.option(True, K.boolean, "train with the auxiliary PGI head; never part of saved weights")
    aux_weight: float = K.option(0.25, K.nonneg(K.number), "weight of the auxiliary head's loss")


FAMILY = register(
    Family(
        name="yolo9",
        prefix="LibreYOLO9",
        sizes=("t", "s", "m", "c"),
        task="detect",
        loss_terms=("box", "cls", "dfl"),
        impl="libreyolo.families.yolo9.impl",
        options=Yolo9Keys,
        capture=WHOLE_NET,
        supports_ddp=True,
        defaults={"amp": True, "sync_bn": True},
        order=0,
        backbone=("stem", "b3", "b4", "b5"),
        convert="libreyolo.families.yolo9.convert",
        export="libreyolo.families.yolo9.export",
        published=(
            "LibreYOLO 1.6 publishes YOLOv9 weights at huggingface.co/LibreYOLO (LibreYOLO9m, LibreYOLO9c: a .pt or "
            ".safetensors file)"
        ),
    )
)
