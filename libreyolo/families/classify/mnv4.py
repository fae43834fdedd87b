"""MobileNetV4-Conv-Small, -Medium and -Large (Qin et al., "MobileNetV4: Universal Models for the Mobile Ecosystem",
2024), written from the paper's block tables: a conv stem, fused inverted bottlenecks, then universal inverted
bottlenecks (UIB) whose optional depthwise convolutions before and after the expansion make the paper's four block
kinds (ExtraDW: both, IB: middle only, ConvNext-like: start only, FFN: neither), a 1x1 conv to 960, global pooling,
a 1x1 conv to 1280 and the classifier. Parameter counts: tests/test_sizes.py."""

from __future__ import annotations

import torch
from torch import nn


def conv_bn(c1: int, c2: int, k: int = 1, s: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c1, c2, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c2)]
    if act:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class FusedIB(nn.Module):
    """A full k x k convolution to the expanded width (carrying the stride), then a linear 1x1 projection."""

    def __init__(self, c1: int, c2: int, expanded: int, k: int = 3, s: int = 1):
        super().__init__()
        self.expand = conv_bn(c1, expanded, k, s)
        self.project = conv_bn(expanded, c2, 1, act=False)
        self.residual = s == 1 and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.expand(x))
        return x + y if self.residual else y


class UIB(nn.Module):
    """start depthwise (k_start, no activation) -> 1x1 expand -> middle depthwise (k_mid) -> linear 1x1 project.
    k_start or k_mid 0 leaves that depthwise out; the stride sits on the middle depthwise where there is one, else
    on the start one (the paper's ExtraDW downsamples in its second depthwise)."""

    def __init__(self, c1: int, c2: int, expanded: int, k_start: int, k_mid: int, s: int = 1):
        super().__init__()
        s_start = s if not k_mid else 1
        self.start = conv_bn(c1, c1, k_start, s_start, groups=c1, act=False) if k_start else nn.Identity()
        self.expand = conv_bn(c1, expanded, 1)
        self.mid = conv_bn(expanded, expanded, k_mid, s, groups=expanded) if k_mid else nn.Identity()
        self.project = conv_bn(expanded, c2, 1, act=False)
        self.residual = s == 1 and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.mid(self.expand(self.start(x))))
        return x + y if self.residual else y


# the paper's MNv4-Conv-S table after the fused stages: (k_start, k_mid, stride, expanded width, output width)
UIB_SMALL = (
    (5, 5, 2, 192, 96),  # ExtraDW
    (0, 3, 1, 192, 96),  # IB x4
    (0, 3, 1, 192, 96),
    (0, 3, 1, 192, 96),
    (0, 3, 1, 192, 96),
    (3, 0, 1, 384, 96),  # ConvNext-like
    (3, 3, 2, 576, 128),  # ExtraDW
    (5, 5, 1, 512, 128),  # ExtraDW
    (0, 5, 1, 512, 128),  # IB
    (0, 5, 1, 384, 128),
    (0, 3, 1, 512, 128),
    (0, 3, 1, 512, 128),
)


def _uibs(c: int, rows: tuple[tuple[int, int, int, int, int, int], ...]) -> tuple[tuple[int, int, int, int, int], ...]:
    """The paper's M/L rows (repeats, k_start, k_mid, stride, expansion ratio, output width) -> UIB_SMALL's form,
    the expanded width being the block's input width times the ratio; the stride is the first repeat's."""
    out = []
    for n, a, k, s, e, c2 in rows:
        for i in range(n):
            out.append((a, k, s if i == 0 else 1, c * e, c2))
            c = c2
    return tuple(out)


UIB_MEDIUM = _uibs(
    48,
    (
        (1, 3, 5, 2, 4, 80), (1, 3, 3, 1, 2, 80),
        (1, 3, 5, 2, 6, 160), (2, 3, 3, 1, 4, 160), (1, 3, 5, 1, 4, 160), (1, 3, 3, 1, 4, 160),
        (1, 3, 0, 1, 4, 160), (1, 0, 0, 1, 2, 160), (1, 3, 0, 1, 4, 160),
        (1, 5, 5, 2, 6, 256), (1, 5, 5, 1, 4, 256), (2, 3, 5, 1, 4, 256), (1, 0, 0, 1, 4, 256),
        (1, 3, 0, 1, 4, 256), (1, 3, 5, 1, 2, 256), (1, 5, 5, 1, 4, 256), (2, 0, 0, 1, 4, 256), (1, 5, 0, 1, 2, 256),
    ),
)  # fmt: skip
UIB_LARGE = _uibs(
    48,
    (
        (1, 3, 5, 2, 4, 96), (1, 3, 3, 1, 4, 96),
        (1, 3, 5, 2, 4, 192), (3, 3, 3, 1, 4, 192), (1, 3, 5, 1, 4, 192), (5, 5, 3, 1, 4, 192), (1, 3, 0, 1, 4, 192),
        (4, 5, 5, 2, 4, 512), (1, 5, 0, 1, 4, 512), (1, 5, 3, 1, 4, 512), (2, 5, 0, 1, 4, 512), (1, 5, 3, 1, 4, 512),
        (1, 5, 5, 1, 4, 512), (3, 5, 0, 1, 4, 512),
    ),
)  # fmt: skip


def _stem(size: str) -> list[nn.Module]:
    """The stride-4 start: S has a conv and two fused blocks, M and L a conv and one fused block."""
    if size == "s":
        return [conv_bn(3, 32, 3, 2), FusedIB(32, 32, 32, 3, 2), FusedIB(32, 64, 96, 3, 2)]
    c = 32 if size == "m" else 24
    return [conv_bn(3, c, 3, 2), FusedIB(c, 48, 4 * c, 3, 2)]


UIBS = {"s": UIB_SMALL, "m": UIB_MEDIUM, "l": UIB_LARGE}


class MobileNetV4(nn.Module):
    def __init__(self, nc: int, size: str = "s", dropout: float = 0.0):
        super().__init__()
        self.nc = nc
        layers = _stem(size)
        c = 64 if size == "s" else 48
        for k_start, k_mid, s, e, c2 in UIBS[size]:
            layers.append(UIB(c, c2, e, k_start, k_mid, s))
            c = c2
        layers.append(conv_bn(c, 960, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = conv_bn(960, 1280, 1)  # on the pooled 1x1 map, as the paper's last Conv2D
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(1280, nc)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.pool(self.features(x))).flatten(1)
        return self.classifier(self.dropout(x))


class MobileNetV4ConvSmall(MobileNetV4):
    def __init__(self, nc: int, dropout: float = 0.0):
        super().__init__(nc, "s", dropout)
