"""The YOLOX detector: CSPDarknet backbone (Focus stem, CSP stages, SPP), PAFPN neck and a decoupled,
anchor-free head (per level: a 1x1 stem, then a classification branch and a box branch that also predicts
objectness). Written from the YOLOX paper's description and its published model sizes."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.nn.blocks import Conv
from libreyolo.nn.streams import branches, forking

PRIOR_PROB = 0.01  # initial class / objectness probability: the head starts out predicting "nothing here"


@dataclass(frozen=True)
class Scale:
    depth: float
    width: float
    depthwise: bool = False


SIZES: dict[str, Scale] = {
    "n": Scale(0.33, 0.25, depthwise=True),  # YOLOX-Nano
    "t": Scale(0.33, 0.375),  # YOLOX-Tiny
    "s": Scale(0.33, 0.50),  # YOLOX-S
    "m": Scale(0.67, 0.75),  # YOLOX-M
    "l": Scale(1.0, 1.0),  # YOLOX-L
    "x": Scale(1.33, 1.25),  # YOLOX-X
}


class DWConv(nn.Module):
    """Depthwise k x k conv (BN, SiLU) followed by a pointwise 1x1 conv (BN, SiLU): YOLOX-Nano's convolution."""

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1):
        super().__init__()
        self.dconv = Conv(c1, c1, k, s, g=c1)
        self.pconv = Conv(c1, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


def conv3(c1: int, c2: int, s: int, depthwise: bool) -> nn.Module:
    """The 3x3 convolution of a block: depthwise-separable in the Nano model, plain otherwise."""
    return DWConv(c1, c2, 3, s) if depthwise else Conv(c1, c2, 3, s)


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool, depthwise: bool):
        super().__init__()
        self.conv1 = Conv(c1, c2, 1, 1)
        self.conv2 = conv3(c2, c2, 1, depthwise)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class CSPLayer(nn.Module):
    """Cross-stage partial block: half the channels through n bottlenecks, half straight across, then fused."""

    def __init__(self, c1: int, c2: int, n: int, shortcut: bool = True, depthwise: bool = False):
        super().__init__()
        c_ = c2 // 2
        self.conv1 = Conv(c1, c_, 1, 1)
        self.conv2 = Conv(c1, c_, 1, 1)
        self.conv3 = Conv(2 * c_, c2, 1, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, depthwise) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if forking(x):  # captured: conv2 beside the bottleneck chain (nn/streams.py)
            return self.conv3(torch.cat(branches([x], lambda: self.m(self.conv1(x)), lambda: self.conv2(x)), 1))
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), 1))


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling with parallel 5/9/13 max-pools (YOLOX keeps the parallel form)."""

    def __init__(self, c1: int, c2: int, ks: tuple[int, ...] = (5, 9, 13)):
        super().__init__()
        c_ = c1 // 2
        self.conv1 = Conv(c1, c_, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in ks)
        self.conv2 = Conv(c_ * (len(ks) + 1), c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x, *(m(x) for m in self.m)], 1))


class Focus(nn.Module):
    """Space-to-depth (each 2x2 pixel block into 4 channels), then a 3x3 conv: the stride-2 stem."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.conv = Conv(4 * c1, c2, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class CSPDarknet(nn.Module):
    """-> the stride-8, 16 and 32 feature maps."""

    def __init__(self, depth: float, width: float, depthwise: bool):
        super().__init__()
        c = int(width * 64)
        n = max(round(depth * 3), 1)
        self.stem = Focus(3, c)
        self.dark2 = nn.Sequential(conv3(c, 2 * c, 2, depthwise), CSPLayer(2 * c, 2 * c, n, depthwise=depthwise))
        self.dark3 = nn.Sequential(
            conv3(2 * c, 4 * c, 2, depthwise), CSPLayer(4 * c, 4 * c, 3 * n, depthwise=depthwise)
        )
        self.dark4 = nn.Sequential(
            conv3(4 * c, 8 * c, 2, depthwise), CSPLayer(8 * c, 8 * c, 3 * n, depthwise=depthwise)
        )
        self.dark5 = nn.Sequential(
            conv3(8 * c, 16 * c, 2, depthwise),
            SPPBottleneck(16 * c, 16 * c),
            CSPLayer(16 * c, 16 * c, n, False, depthwise),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c3 = self.dark3(self.dark2(self.stem(x)))
        c4 = self.dark4(c3)
        return c3, c4, self.dark5(c4)


class PAFPN(nn.Module):
    """Top-down then bottom-up fusion of the three backbone levels."""

    def __init__(self, depth: float, width: float, depthwise: bool):
        super().__init__()
        c3, c4, c5 = (int(c * width) for c in (256, 512, 1024))
        n = round(3 * depth)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.lateral_conv0 = Conv(c5, c4, 1, 1)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, False, depthwise)
        self.reduce_conv1 = Conv(c4, c3, 1, 1)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, False, depthwise)
        self.bu_conv2 = conv3(c3, c3, 2, depthwise)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, False, depthwise)
        self.bu_conv1 = conv3(c4, c4, 2, depthwise)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, False, depthwise)

    def forward(self, feats: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        x3, x4, x5 = feats
        lat5 = self.lateral_conv0(x5)
        p4 = self.C3_p4(torch.cat((self.up(lat5), x4), 1))
        lat4 = self.reduce_conv1(p4)
        out3 = self.C3_p3(torch.cat((self.up(lat4), x3), 1))
        out4 = self.C3_n3(torch.cat((self.bu_conv2(out3), lat4), 1))
        out5 = self.C3_n4(torch.cat((self.bu_conv1(out4), lat5), 1))
        return [out3, out4, out5]


class DecoupledHead(nn.Module):
    """Per level: 1x1 stem; a classification branch (two 3x3 convs -> class logits) and a box branch (two
    3x3 convs -> 4 box offsets and 1 objectness logit). Output (B, A, 4 + 1 + nc), levels concatenated."""

    def __init__(self, nc: int, width: float, depthwise: bool, in_channels: tuple[int, ...] = (256, 512, 1024)):
        super().__init__()
        h = int(256 * width)
        self.stems = nn.ModuleList(Conv(int(c * width), h, 1, 1) for c in in_channels)
        self.cls_convs = nn.ModuleList(
            nn.Sequential(conv3(h, h, 1, depthwise), conv3(h, h, 1, depthwise)) for _ in in_channels
        )
        self.reg_convs = nn.ModuleList(
            nn.Sequential(conv3(h, h, 1, depthwise), conv3(h, h, 1, depthwise)) for _ in in_channels
        )
        self.cls_preds = nn.ModuleList(nn.Conv2d(h, nc, 1) for _ in in_channels)
        self.reg_preds = nn.ModuleList(nn.Conv2d(h, 4, 1) for _ in in_channels)
        self.obj_preds = nn.ModuleList(nn.Conv2d(h, 1, 1) for _ in in_channels)
        bias = -math.log((1 - PRIOR_PROB) / PRIOR_PROB)
        for m in (*self.cls_preds, *self.obj_preds):
            nn.init.constant_(m.bias, bias)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        # captured: the levels side by side, and in each its box and class branches (nn/streams.py)
        outs = branches(feats, *(functools.partial(self._level, k, x) for k, x in enumerate(feats)))
        return torch.cat(outs, 2).transpose(1, 2)  # (B, A, 5 + nc); anchor index = level offset + y * W + x

    def _level(self, k: int, x: torch.Tensor) -> torch.Tensor:
        x = self.stems[k](x)

        def box() -> tuple[torch.Tensor, torch.Tensor]:
            reg_feat = self.reg_convs[k](x)
            return self.reg_preds[k](reg_feat), self.obj_preds[k](reg_feat)

        def cls() -> tuple[torch.Tensor]:
            return (self.cls_preds[k](self.cls_convs[k](x)),)

        box_out, cls_out = branches([x], box, cls)
        return torch.cat((*box_out, *cls_out), 1).flatten(2)


class YOLOX(nn.Module):
    """forward(float input in [0, 1], NCHW) -> raw (B, A, 4 + 1 + nc): box offsets (xy in cells from the cell's
    corner, wh as log-sizes in strides), objectness logit, class logits. The same in training and eval: the
    loss and the postprocess decode it."""

    strides = (8, 16, 32)

    def __init__(self, size: str = "s", nc: int = 80):
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown YOLOX size {size!r}; available: {', '.join(SIZES)}")
        sc = SIZES[size]
        self.size, self.nc = size, nc
        self.backbone = CSPDarknet(sc.depth, sc.width, sc.depthwise)
        self.neck = PAFPN(sc.depth, sc.width, sc.depthwise)
        self.head = DecoupledHead(nc, sc.width, sc.depthwise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))

    def feature_shapes(self, h: int, w: int) -> list[tuple[int, int]]:
        """Feature-map sizes for an input of h x w (which the loader keeps a multiple of 32)."""
        return [(h // s, w // s) for s in self.strides]
