"""Image classifiers (task "classify"): ResNet-18/34/50 (`LibreResNet18`, `LibreResNet34`, `LibreResNet50`) and
MobileNetV4-Conv-S/M/L (`LibreMNv4s`, `LibreMNv4m`, `LibreMNv4l`); their description. The implementation is impl.py,
imported on first use.

They train through the same loop as the detectors: the classify data pipeline (libreyolo/data/classify.py)
hands each image's class in the engine's targets layout, the loss is one cross-entropy term with label
smoothing (a family key), and the whole step may be captured as one CUDA graph (static shapes, no assignment).
Validation reports top-1 and top-5 accuracy (libreyolo/tasks/classify/)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libreyolo import keys as K
from libreyolo.families import WHOLE_NET, Family, register


@dataclass(frozen=True)
class ClassifyKeys:
    label_smoothing: float = K.option(0.1, K.nonneg(K.number), "cross-entropy label smoothing (0: hard labels)")


# where a classifier's recipe differs from the detectors' shared defaults: no mosaic (nor its closing epochs),
# random-resized-crop areas from 8% of the image (torchvision's; `scale` sets 1 - the smallest area), no
# rotation or shear, a short warm-up
DEFAULTS: dict[str, Any] = {
    "mosaic": 0.0,
    "no_aug_epochs": 0,
    "scale": 0.92,
    "degrees": 0.0,
    "shear": 0.0,
    "warmup_epochs": 1.0,
}


def _family(
    name: str,
    prefix: str,
    sizes: tuple[str, ...],
    impl: str,
    order: int,
    backbone: tuple[str, ...],
    convert: str = "",
    published: str = "",
) -> Family:
    return register(
        Family(
            name=name,
            prefix=prefix,
            sizes=sizes,
            task="classify",
            loss_terms=("ce",),
            impl=f"libreyolo.families.classify.impl:{impl}",
            options=ClassifyKeys,
            capture=WHOLE_NET,
            supports_ddp=True,
            defaults=DEFAULTS,
            order=order,
            convert=convert,
            export="libreyolo.families.classify.export",
            published=published,
            backbone=backbone,
        )
    )


TORCHVISION = (
    "torchvision publishes ImageNet ResNet weights (torchvision.models.ResNet18_Weights etc.; on a machine with a "
    "network: torchvision.models.resnet18(weights='IMAGENET1K_V1') caches resnet18-f37072fd.pth under "
    "~/.cache/torch/hub/checkpoints)"
)
RESNET_BACKBONE = ("body.conv1", "body.bn1", "body.layer1", "body.layer2", "body.layer3", "body.layer4")
RESNET = _family(
    "resnet",
    "LibreResNet",
    ("18", "34", "50"),
    "RESNET",
    3,
    RESNET_BACKBONE,
    "libreyolo.families.classify.convert",
    TORCHVISION,
)
MNV4 = _family(
    "mnv4",
    "LibreMNv4",
    ("s", "m", "l"),
    "MNV4",
    4,
    ("features",),
    "libreyolo.families.classify.convert_mnv4",
    "LibreYOLO 1.6 publishes MobileNetV4 weights at huggingface.co/LibreYOLO",
)
