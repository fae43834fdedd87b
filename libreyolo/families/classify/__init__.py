"""Image classifiers (task "classify"): ResNet-18 (`LibreResNet18`) and MobileNetV4-Conv-Small (`LibreMNv4s`).

They train through the same loop as the detectors: the classify data pipeline (libreyolo/data/classify.py)
hands each image's class in the engine's targets layout, the loss is one cross-entropy term with label
smoothing (a family key), and the whole step may be captured as one CUDA graph (static shapes, no assignment).
Validation reports top-1 and top-5 accuracy (libreyolo/tasks.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo import keys as K
from libreyolo.families import WHOLE_NET, Family, Reduce, random_output, register
from libreyolo.families.classify.head import ClassifyLoss, topk
from libreyolo.families.classify.mnv4 import MobileNetV4ConvSmall
from libreyolo.families.classify.resnet import ResNet18

TASK = "classify"
LOSS_TERMS = ("ce",)
KEYS = (K.Key("label_smoothing", 0.1, K.nonneg(K.number), "cross-entropy label smoothing (0: hard labels)"),)

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


def train_net(net: nn.Module, cfg: Any) -> nn.Module:
    return net


def loss(net: nn.Module, cfg: Any, reduce_normalizer: Reduce | None = None) -> ClassifyLoss:
    # a config built without this family's keys (model.val() of another family's config) takes the default
    ls = getattr(cfg, "label_smoothing", None)
    return ClassifyLoss(float(ls) if ls is not None else float(KEYS[0].default))


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> torch.Tensor:
    """Random class logits: (batch, nc)."""
    nc = int(getattr(train, "nc"))  # noqa: B009  (nn.Module types its attributes Tensor | Module)
    return random_output((batch, nc), dtype, device)


def _family(name: str, prefix: str, sizes: tuple[str, ...], build: Any) -> Family:
    return register(
        Family(
            name=name,
            prefix=prefix,
            sizes=sizes,
            task=TASK,
            build=build,
            train_net=train_net,
            loss=loss,
            postprocess=topk,
            loss_terms=LOSS_TERMS,
            keys=KEYS,
            capture=WHOLE_NET,
            supports_ddp=True,
            defaults=DEFAULTS,
            example_outputs=example_outputs,
        )
    )


def build_resnet(size: str, nc: int) -> ResNet18:
    return ResNet18(nc)


def build_mnv4(size: str, nc: int) -> MobileNetV4ConvSmall:
    return MobileNetV4ConvSmall(nc)


RESNET = _family("resnet", "LibreResNet", ("18",), build_resnet)
MNV4 = _family("mnv4", "LibreMNv4", ("s",), build_mnv4)

__all__ = ["MNV4", "RESNET", "ClassifyLoss", "MobileNetV4ConvSmall", "ResNet18", "topk"]
