"""ResNet-18, -34 and -50: torchvision's, built with weights=None (random init, nothing downloaded); `body` holds
torchvision's module, so a torchvision state dict loads under the prefix "body."."""

from __future__ import annotations

import torch
from torch import nn


class ResNet(nn.Module):
    def __init__(self, nc: int, depth: str = "18"):
        super().__init__()
        self.nc = nc
        from torchvision.models import resnet18, resnet34, resnet50  # here: every run imports the registry

        build = {"18": resnet18, "34": resnet34, "50": resnet50}[depth]
        self.body = build(weights=None, num_classes=nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class ResNet18(ResNet):
    def __init__(self, nc: int):
        super().__init__(nc, "18")
