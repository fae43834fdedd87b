"""HGNetv2, D-FINE's backbone (PaddlePaddle's PP-HGNetV2, sizes B0 and B2 here): a stem that halves the image
twice (one branch pooling, one convolving, joined), then four stages of HG blocks. An HG block runs a chain of
convolutions, concatenates the input with every link's output and squeezes the concatenation back with two 1x1
convolutions ("aggregation"); the later stages use light links (1x1 then depthwise). With `lab`, every activated
convolution is followed by a learnable scale and shift (one scalar each). Returns the feature maps of the stages
asked for (strides 4, 8, 16, 32). Module names follow the official code's, so its weights map by prefix alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Stage:
    c_in: int
    mid: int
    c_out: int
    blocks: int
    downsample: bool
    light: bool
    kernel: int
    layers: int  # links per block


Arch = tuple[tuple[int, int], tuple[Stage, ...]]  # (stem mid, stem out), the four stages
# the PP-HGNetV2 B0 and B2 tables that D-FINE n/s and m use
ARCHS: dict[str, Arch] = {
    "B0": (
        (16, 16),
        (
            Stage(16, 16, 64, 1, False, False, 3, 3),
            Stage(64, 32, 256, 1, True, False, 3, 3),
            Stage(256, 64, 512, 2, True, True, 5, 3),
            Stage(512, 128, 1024, 1, True, True, 5, 3),
        ),
    ),
    "B2": (
        (24, 32),
        (
            Stage(32, 32, 96, 1, False, False, 3, 4),
            Stage(96, 64, 384, 1, True, False, 3, 4),
            Stage(384, 128, 768, 3, True, True, 5, 4),
            Stage(768, 256, 1536, 1, True, True, 5, 4),
        ),
    ),
}


class Affine(nn.Module):
    """A learnable scalar scale and shift ("learnable affine block")."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


class ConvBNAct(nn.Module):
    def __init__(self, c1: int, c2: int, k: int, s: int = 1, g: int = 1, act: bool = True, lab: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, (k - 1) // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act: nn.Module = nn.ReLU() if act else nn.Identity()
        self.lab: nn.Module = Affine() if act and lab else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lab(self.act(self.bn(self.conv(x))))


class LightConv(nn.Module):
    """1x1 (no activation) then a depthwise k x k."""

    def __init__(self, c1: int, c2: int, k: int, lab: bool):
        super().__init__()
        self.conv1 = ConvBNAct(c1, c2, 1, act=False, lab=lab)
        self.conv2 = ConvBNAct(c2, c2, k, g=c2, lab=lab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class Stem(nn.Module):
    def __init__(self, mid: int, out: int, lab: bool):
        super().__init__()
        self.stem1 = ConvBNAct(3, mid, 3, 2, lab=lab)
        self.stem2a = ConvBNAct(mid, mid // 2, 2, lab=lab)
        self.stem2b = ConvBNAct(mid // 2, mid, 2, lab=lab)
        self.stem3 = ConvBNAct(mid * 2, mid, 3, 2, lab=lab)
        self.stem4 = ConvBNAct(mid, out, 1, lab=lab)
        self.pool = nn.MaxPool2d(2, 1, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the 2x2 convolutions and the pool keep the size through a one-pixel pad on the right and bottom
        x = F.pad(self.stem1(x), (0, 1, 0, 1))
        branch = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        return self.stem4(self.stem3(torch.cat((self.pool(x), branch), 1)))


class HGBlock(nn.Module):
    def __init__(self, c1: int, mid: int, c2: int, layers: int, k: int, residual: bool, light: bool, lab: bool):
        super().__init__()
        self.residual = residual
        self.layers = nn.ModuleList(
            LightConv(c1 if i == 0 else mid, mid, k, lab)
            if light
            else ConvBNAct(c1 if i == 0 else mid, mid, k, lab=lab)
            for i in range(layers)
        )
        total = c1 + layers * mid
        self.aggregation = nn.Sequential(ConvBNAct(total, c2 // 2, 1, lab=lab), ConvBNAct(c2 // 2, c2, 1, lab=lab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [x]
        for layer in self.layers:
            outs.append(layer(outs[-1]))
        y = self.aggregation(torch.cat(outs, 1))
        return y + x if self.residual else y


class HGStage(nn.Module):
    def __init__(self, st: Stage, lab: bool):
        super().__init__()
        # a depthwise 3x3 of stride 2, no activation
        self.downsample: nn.Module = (
            ConvBNAct(st.c_in, st.c_in, 3, 2, g=st.c_in, act=False, lab=lab) if st.downsample else nn.Identity()
        )
        self.blocks = nn.Sequential(
            *(
                HGBlock(st.c_in if i == 0 else st.c_out, st.mid, st.c_out, st.layers, st.kernel, i > 0, st.light, lab)
                for i in range(st.blocks)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class HGNetv2(nn.Module):
    """arch: "B0" or "B2" (or a table of one's own: (stem mid, stem out), four stages); returns: the stages (0-3)
    whose outputs are returned; lab: the learnable affine blocks (D-FINE n, s and m have them)."""

    def __init__(self, arch: str | Arch, returns: tuple[int, ...], lab: bool = True):
        super().__init__()
        (mid, out), stages = ARCHS[arch] if isinstance(arch, str) else arch
        self.returns = returns
        self.stem = Stem(mid, out, lab)
        self.stages = nn.ModuleList(HGStage(st, lab) for st in stages)
        self.out_channels = tuple(stages[i].c_out for i in returns)
        self.strides = tuple(4 * 2**i for i in returns)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.returns:
                outs.append(x)
        return outs
