"""The RTMDet detector (Lyu et al. 2022, arXiv:2212.07784): CSPNeXt backbone (a three-convolution stem, four stages
of a stride-2 convolution and a CSP layer whose blocks are a 3x3 convolution then a 5x5 depthwise-separable one, with
channel attention; SPP before the last stage's layer), a CSPNeXt PAFPN neck, and a head whose convolutions are shared
by the three levels while each level keeps its own BatchNorm. Written from the paper and mmdetection's published
configs; module names follow mmdetection's so that its checkpoints map by name (convert.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.nn.blocks import Conv

PRIOR_PROB = 0.01  # the class branch starts out predicting "nothing here"
MAX_LOG_SIZE = math.log(1e4)  # exp-distance heads: a log-distance (in strides) above this is clamped (no overflow)
# mmdetection's RTMDet normalises BGR pixels in 0..255 by these (its data preprocessor); here RGB in 0..1 comes in
MEAN_RGB = (123.675, 116.28, 103.53)
STD_RGB = (58.395, 57.12, 57.375)


@dataclass(frozen=True)
class Scale:
    depth: float
    width: float
    neck_blocks: int
    exp_on_reg: bool  # distances are exp(output) * stride (m, l, x) instead of output * stride (t, s)


SIZES: dict[str, Scale] = {
    "t": Scale(0.167, 0.375, 1, False),
    "s": Scale(0.33, 0.5, 1, False),
    "m": Scale(0.67, 0.75, 2, True),
    "l": Scale(1.0, 1.0, 3, True),
    "x": Scale(1.33, 1.25, 4, True),
}
# per stage at width 1: output channels, blocks at depth 1, identity shortcut in the blocks, SPP before the layer
STAGES = ((128, 3, True, False), (256, 6, True, False), (512, 6, True, False), (1024, 3, False, True))


def conv(c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1) -> Conv:
    """Conv + BN + SiLU with torch's BatchNorm settings: RTMDet trains with SyncBN at its defaults (eps 1e-5,
    momentum 0.1), and its checkpoints' statistics are for that eps."""
    m = Conv(c1, c2, k, s, g=g)
    m.bn.eps, m.bn.momentum = 1e-5, 0.1
    return m


class DepthwiseSeparable(nn.Module):
    def __init__(self, c1: int, c2: int, k: int):
        super().__init__()
        self.depthwise_conv = conv(c1, c1, k, g=c1)
        self.pointwise_conv = conv(c1, c2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class CSPNeXtBlock(nn.Module):
    def __init__(self, c: int, shortcut: bool):
        super().__init__()
        self.conv1 = conv(c, c, 3)
        self.conv2 = DepthwiseSeparable(c, c, 5)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.shortcut else y


class ChannelAttention(nn.Module):
    """Squeeze-and-excite without the bottleneck: global mean, a 1x1 convolution, hard sigmoid, rescale."""

    def __init__(self, c: int):
        super().__init__()
        self.fc = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.hardsigmoid(self.fc(x.mean((2, 3), keepdim=True)))


class CSPLayer(nn.Module):
    def __init__(self, c1: int, c2: int, n: int, shortcut: bool, attention: bool):
        super().__init__()
        c_ = c2 // 2
        self.main_conv = conv(c1, c_)
        self.short_conv = conv(c1, c_)
        self.final_conv = conv(2 * c_, c2)
        self.blocks = nn.Sequential(*(CSPNeXtBlock(c_, shortcut) for _ in range(n)))
        self.attention = ChannelAttention(2 * c_) if attention else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat((self.blocks(self.main_conv(x)), self.short_conv(x)), 1)
        return self.final_conv(self.attention(y))


class SPPBottleneck(nn.Module):
    """Parallel 5/9/13 max-pools (mmdetection's form, which its RTMDet checkpoints were trained with)."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        c_ = c1 // 2
        self.conv1 = conv(c1, c_)
        self.poolings = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in (5, 9, 13))
        self.conv2 = conv(4 * c_, c2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x, *(p(x) for p in self.poolings)], 1))


class CSPNeXt(nn.Module):
    """-> the stride-8, 16 and 32 feature maps."""

    def __init__(self, depth: float, width: float):
        super().__init__()
        c = int(64 * width)
        self.stem = nn.Sequential(conv(3, c // 2, 3, 2), conv(c // 2, c // 2, 3), conv(c // 2, c, 3))
        stages = []
        for out, n, shortcut, spp in STAGES:
            c_out = int(out * width)
            layers: list[nn.Module] = [conv(c, c_out, 3, 2)]
            if spp:
                layers.append(SPPBottleneck(c_out, c_out))
            layers.append(CSPLayer(c_out, c_out, max(round(n * depth), 1), shortcut, attention=True))
            stages.append(nn.Sequential(*layers))
            c = c_out
        self.stage1, self.stage2, self.stage3, self.stage4 = stages

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x2 = self.stage2(self.stage1(self.stem(x)))
        x3 = self.stage3(x2)
        return x2, x3, self.stage4(x3)


class PAFPN(nn.Module):
    """Top-down then bottom-up fusion with CSP layers (no attention), then a 3x3 convolution per level to the head's
    width. Lists are in mmdetection's order: reduce_layers / top_down_blocks from the deepest level up."""

    def __init__(self, width: float, n: int):
        super().__init__()
        c3, c4, c5 = (int(c * width) for c in (256, 512, 1024))
        out = int(256 * width)
        self.reduce_layers = nn.ModuleList((conv(c5, c4), conv(c4, c3)))
        self.top_down_blocks = nn.ModuleList(
            (CSPLayer(2 * c4, c4, n, False, False), CSPLayer(2 * c3, c3, n, False, False))
        )
        self.downsamples = nn.ModuleList((conv(c3, c3, 3, 2), conv(c4, c4, 3, 2)))
        self.bottom_up_blocks = nn.ModuleList(
            (CSPLayer(2 * c3, c4, n, False, False), CSPLayer(2 * c4, c5, n, False, False))
        )
        self.out_convs = nn.ModuleList(conv(c, out, 3) for c in (c3, c4, c5))

    def forward(self, feats: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        x3, x4, x5 = feats
        r5 = self.reduce_layers[0](x5)
        t4 = self.top_down_blocks[0](torch.cat((F.interpolate(r5, scale_factor=2.0), x4), 1))
        r4 = self.reduce_layers[1](t4)
        p3 = self.top_down_blocks[1](torch.cat((F.interpolate(r4, scale_factor=2.0), x3), 1))
        p4 = self.bottom_up_blocks[0](torch.cat((self.downsamples[0](p3), r4), 1))
        p5 = self.bottom_up_blocks[1](torch.cat((self.downsamples[1](p4), r5), 1))
        return [out(p) for out, p in zip(self.out_convs, (p3, p4, p5))]


class SepBNHead(nn.Module):
    """Two stacked 3x3 convolutions per branch (class, box) whose weights all levels share, each level with its own
    BatchNorm, then a 1x1 prediction convolution per level. The shared weights are held once (cls_convs /
    reg_convs), the per-level norms beside them (cls_norms / reg_norms [level][layer]): no module appears twice, so
    the EMA, the optimizer and a checkpoint see each tensor once."""

    def __init__(self, nc: int, c: int, strides: tuple[int, ...], exp_on_reg: bool, stacked: int = 2):
        super().__init__()
        self.strides, self.exp_on_reg = strides, exp_on_reg
        levels = len(strides)
        cls_convs = [nn.Conv2d(c, c, 3, 1, 1, bias=False) for _ in range(stacked)]
        reg_convs = [nn.Conv2d(c, c, 3, 1, 1, bias=False) for _ in range(stacked)]
        rtm_cls = [nn.Conv2d(c, nc, 1) for _ in range(levels)]
        rtm_reg = [nn.Conv2d(c, 4, 1) for _ in range(levels)]
        # RTMDet's head initialisation: N(0, 0.01) weights, zero biases, the class bias at the prior
        for m in (*cls_convs, *reg_convs, *rtm_cls, *rtm_reg):
            nn.init.normal_(m.weight, std=0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        for m in rtm_cls:
            assert m.bias is not None
            nn.init.constant_(m.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))
        self.cls_convs, self.reg_convs = nn.ModuleList(cls_convs), nn.ModuleList(reg_convs)
        self.cls_norms = nn.ModuleList(nn.ModuleList(_bn(c) for _ in range(stacked)) for _ in range(levels))
        self.reg_norms = nn.ModuleList(nn.ModuleList(_bn(c) for _ in range(stacked)) for _ in range(levels))
        self.rtm_cls, self.rtm_reg = nn.ModuleList(rtm_cls), nn.ModuleList(rtm_reg)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        outs = [self._level(k, x) for k, x in enumerate(feats)]
        return torch.cat(outs, 2).transpose(1, 2)  # (B, A, 4 + nc); anchor index = level offset + y * W + x

    def _level(self, k: int, x: torch.Tensor) -> torch.Tensor:
        c, r = x, x
        cls_norms, reg_norms = self.cls_norms[k], self.reg_norms[k]
        assert isinstance(cls_norms, nn.ModuleList) and isinstance(reg_norms, nn.ModuleList)
        for conv_, bn in zip(self.cls_convs, cls_norms):
            c = F.silu(bn(conv_(c)))
        for conv_, bn in zip(self.reg_convs, reg_norms):
            r = F.silu(bn(conv_(r)))
        # distances in float32 (the exp of a float16 output overflows from 11), clamped on the exp heads
        reg = self.rtm_reg[k](r).float()
        reg = reg.clamp(max=MAX_LOG_SIZE).exp() if self.exp_on_reg else reg
        return torch.cat((reg * self.strides[k], self.rtm_cls[k](c).float()), 1).flatten(2)


def _bn(c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c)  # eps 1e-5, momentum 0.1 (see conv)
    bn.num_batches_tracked = None  # only used when momentum is None; one kernel less per layer and step
    return bn


class RTMDet(nn.Module):
    """forward(RGB in [0, 1], NCHW) -> raw (B, A, 4 + nc) float32: per anchor (cell corners of strides 8, 16, 32,
    row-major per level) the left, top, right, bottom distances in input pixels, then the class logits. The same in
    training and eval: the loss and the postprocess decode it."""

    strides = (8, 16, 32)
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, size: str = "s", nc: int = 80):
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown RTMDet size {size!r}; available: {', '.join(SIZES)}")
        sc = SIZES[size]
        self.size, self.nc = size, nc
        self.backbone = CSPNeXt(sc.depth, sc.width)
        self.neck = PAFPN(sc.width, sc.neck_blocks)
        self.head = SepBNHead(nc, int(256 * sc.width), self.strides, sc.exp_on_reg)
        # the input normalisation of RTMDet's recipe, in this project's RGB 0..1 (buffers: they follow .to())
        self.register_buffer("mean", torch.tensor(MEAN_RGB).view(1, 3, 1, 1) / 255.0, persistent=False)
        self.register_buffer("std", torch.tensor(STD_RGB).view(1, 3, 1, 1) / 255.0, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return self.head(self.neck(self.backbone(x)))

    def feature_shapes(self, h: int, w: int) -> list[tuple[int, int]]:
        """Feature-map sizes for an input of h x w (which the loader keeps a multiple of 32)."""
        return [(h // s, w // s) for s in self.strides]
