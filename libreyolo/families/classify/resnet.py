"""ResNet-18: torchvision's, built with weights=None (random init, nothing downloaded)."""

from __future__ import annotations

import torch
from torch import nn


class ResNet18(nn.Module):
    def __init__(self, nc: int):
        super().__init__()
        self.nc = nc
        from torchvision.models import resnet18  # here: every run imports the registry, few build a ResNet

        self.body = resnet18(weights=None, num_classes=nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
