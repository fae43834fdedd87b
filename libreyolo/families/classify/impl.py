"""The classifiers' implementation: ResNet-18 and MobileNetV4-Conv-Small, one cross-entropy loss, top-k output."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families import RunKeys
from libreyolo.families.base import FamilyImpl, Reduce, random_output
from libreyolo.families.classify import RESNET as RESNET_FAMILY
from libreyolo.families.classify.head import ClassifyLoss, topk
from libreyolo.families.classify.mnv4 import MobileNetV4, MobileNetV4ConvSmall
from libreyolo.families.classify.resnet import ResNet, ResNet18


def train_net(net: nn.Module, cfg: RunKeys) -> nn.Module:
    return net


def loss(net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None) -> ClassifyLoss:
    # the classifiers share their options: a config made for either gives its label smoothing
    return ClassifyLoss(float(RESNET_FAMILY.options_of(cfg).label_smoothing))


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> torch.Tensor:
    """Random class logits: (batch, nc)."""
    nc = int(getattr(train, "nc"))  # noqa: B009  (nn.Module types its attributes Tensor | Module)
    return random_output((batch, nc), dtype, device)


def build_resnet(size: str, nc: int) -> ResNet:
    return ResNet(nc, size)


def build_mnv4(size: str, nc: int) -> MobileNetV4:
    return MobileNetV4(nc, size)


def _impl(build: Any) -> FamilyImpl:
    return FamilyImpl(build=build, train_net=train_net, loss=loss, postprocess=topk, example_outputs=example_outputs)


RESNET = _impl(build_resnet)
MNV4 = _impl(build_mnv4)

__all__ = ["MNV4", "RESNET", "ClassifyLoss", "MobileNetV4", "MobileNetV4ConvSmall", "ResNet", "ResNet18", "topk"]
