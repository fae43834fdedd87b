"""ResNet-vd backbones as RT-DETR uses them (18/34 of basic blocks, 50/101 of bottlenecks): the "vd" tweaks of Bag
of Tricks (He et al. 2019) on torchvision's blocks: a stem of three 3x3 convolutions instead of one 7x7, and
shortcuts that downsample with a 2x2 average pool before their 1x1 convolution instead of a strided 1x1
convolution (which would drop three quarters of the input). Random init; returns the stride 8, 16 and 32 feature
maps."""

from __future__ import annotations

import torch
from torch import nn


def conv_bn_relu(c1: int, c2: int, s: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c1, c2, 3, s, 1, bias=False), nn.BatchNorm2d(c2), nn.ReLU(inplace=True))


def _shortcut(c1: int, c2: int, stride: int) -> nn.Module:
    """A stage's first block always projects its shortcut, even where the shape holds (stage 1 of ResNet-18/34),
    as the official RT-DETR PResNet does: its weights have that 1x1 convolution."""
    pool: nn.Module = nn.AvgPool2d(2, 2, ceil_mode=True) if stride == 2 else nn.Identity()
    return nn.Sequential(pool, nn.Conv2d(c1, c2, 1, bias=False), nn.BatchNorm2d(c2))


class ResNetVd(nn.Module):
    """widths: each stage's block width; bottleneck: torchvision's Bottleneck blocks (stride on the 3x3, output 4x
    the width) instead of its BasicBlocks."""

    def __init__(
        self,
        depths: tuple[int, ...] = (2, 2, 2, 2),
        widths: tuple[int, ...] = (64, 128, 256, 512),
        bottleneck: bool = False,
    ):
        # imported here: every run imports the family registry, and importing torchvision costs it ~2 s
        from torchvision.models.resnet import BasicBlock, Bottleneck

        super().__init__()
        block: type[BasicBlock] | type[Bottleneck] = Bottleneck if bottleneck else BasicBlock
        e = block.expansion
        stem = widths[0]
        self.stem = nn.Sequential(
            conv_bn_relu(3, stem // 2, 2), conv_bn_relu(stem // 2, stem // 2, 1), conv_bn_relu(stem // 2, stem, 1)
        )
        self.pool = nn.MaxPool2d(3, 2, 1)
        stages, c = [], stem
        for i, (n, w) in enumerate(zip(depths, widths)):
            s = 1 if i == 0 else 2
            blocks = [block(c, w, s, _shortcut(c, w * e, s))] + [block(w * e, w) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
            c = w * e
        self.stages = nn.ModuleList(stages)
        self.out_channels = tuple(w * e for w in widths[1:])
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.pool(self.stem(x))
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i > 0:
                outs.append(x)
        return outs
