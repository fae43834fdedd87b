"""The YOLOv9 (GELAN) detector: backbone, PAN neck and DFL head; plus the auxiliary (PGI) training head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.nn.blocks import ELAN1, SPPELAN, ADown, Conv, RepNCSPELAN4
from libreyolo.nn.head import Detect
from libreyolo.nn.streams import branches, fork, join

W3 = tuple[int, int, int]  # a GELAN block's (output, cv1 width, stage width)


@dataclass(frozen=True)
class Widths:
    """A size's widths. The GELAN blocks take (output, cv1 width, stage width); `neck` (top-down P4, P3, bottom-up
    P4, P5) defaults to the backbone's (p4, p3, p4, p5) and `downs` (each backbone stage's downsampler output) to
    the stage outputs. down_block: "adown" (average-pool, then half conv, half max-pool) or "aconv" (average-pool,
    then one strided 3x3 conv); first_rep: the stride-4 block is a GELAN block (m, c) instead of the light ELAN;
    box_groups: the box tower's last two convolutions are grouped (the published m and c heads)."""

    stem: tuple[int, int]
    elan1: W3
    p3: W3
    p4: W3
    p5: W3
    spp: tuple[int, int]
    down: tuple[int, int]  # neck downsamplers P3->P4, P4->P5
    n: int = 3
    neck: tuple[W3, W3, W3, W3] | None = None
    downs: tuple[int, int, int] | None = None
    down_block: str = "adown"
    first_rep: bool = False
    box_groups: int = 1


# t and s are this project's: ADown downsamplers and ungrouped box towers (1.94M and 6.55M parameters at 80
# classes; the published YOLOv9-T and -S use AConv and grouped towers, 2.0M and 7.1M). m and c are the published
# layouts (YOLOv9 paper, Wang et al. 2024, and its GELAN configs): 20.1M and 25.5M at 80 classes.
SIZES: dict[str, Widths] = {
    "t": Widths((16, 32), (32, 32, 16), (64, 64, 32), (96, 96, 48), (128, 128, 64), (128, 64), (48, 64)),
    "s": Widths((32, 64), (64, 64, 32), (128, 128, 64), (192, 192, 96), (256, 256, 128), (256, 128), (96, 128)),
    "m": Widths(
        (32, 64),
        (128, 128, 64),
        (240, 240, 120),
        (360, 360, 180),
        (480, 480, 240),
        (480, 240),
        (184, 240),
        n=1,
        down_block="aconv",
        first_rep=True,
        box_groups=4,
    ),
    "c": Widths(
        (64, 128),
        (256, 128, 64),
        (512, 256, 128),
        (512, 512, 256),
        (512, 512, 256),
        (512, 256),
        (256, 512),
        n=1,
        neck=((512, 512, 256), (256, 256, 128), (512, 512, 256), (512, 512, 256)),
        downs=(256, 512, 512),
        first_rep=True,
        box_groups=4,
    ),
}


class AConv(nn.Module):
    """Stride-2 downsampling of the published YOLOv9-T/S/M: average-pool (2x2, stride 1), then a 3x3/s2 conv."""

    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.cv = Conv(c1, c2, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv(F.avg_pool2d(x, 2, 1, 0, False, True))


class GroupedDetect(Detect):
    """The published m/c head: the box tower's second 3x3 conv and its output conv in `groups` groups."""

    def __init__(self, nc: int, ch: tuple[int, ...], strides: tuple[int, ...], reg_max: int, groups: int):
        super().__init__(nc, ch, strides, reg_max)
        c2 = max(16, ch[0] // 4, reg_max * 4)  # as Detect's box tower
        self.box = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3, g=groups), nn.Conv2d(c2, 4 * reg_max, 1, groups=groups))
            for c in ch
        )
        self.reset_bias()


class YOLO9(nn.Module):
    """forward(uint8-free float input in [0, 1]) -> raw logits (B, 4*reg_max + nc, anchors)."""

    strides = (8, 16, 32)

    def __init__(self, size: str = "t", nc: int = 80, reg_max: int = 16):
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown YOLOv9 size {size!r}; available: {', '.join(SIZES)}")
        w = SIZES[size]
        self.size, self.nc, self.reg_max = size, nc, reg_max
        n = w.n
        down = AConv if w.down_block == "aconv" else ADown
        d3, d4, d5 = w.downs or (w.p3[0], w.p4[0], w.p5[0])
        td4, td3, bu4, bu5 = w.neck or (w.p4, w.p3, w.p4, w.p5)
        # backbone
        first = RepNCSPELAN4(w.stem[1], *w.elan1, n) if w.first_rep else ELAN1(w.stem[1], *w.elan1)
        self.stem = nn.Sequential(Conv(3, w.stem[0], 3, 2), Conv(w.stem[0], w.stem[1], 3, 2), first)
        self.b3 = nn.Sequential(down(w.elan1[0], d3), RepNCSPELAN4(d3, *w.p3, n))
        self.b4 = nn.Sequential(down(w.p3[0], d4), RepNCSPELAN4(d4, *w.p4, n))
        self.b5 = nn.Sequential(down(w.p4[0], d5), RepNCSPELAN4(d5, *w.p5, n), SPPELAN(w.p5[0], *w.spp))
        # neck: top-down then bottom-up
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.td4 = RepNCSPELAN4(w.spp[0] + w.p4[0], *td4, n)
        self.td3 = RepNCSPELAN4(td4[0] + w.p3[0], *td3, n)
        self.down4 = down(td3[0], w.down[0])
        self.bu4 = RepNCSPELAN4(w.down[0] + td4[0], *bu4, n)
        self.down5 = down(bu4[0], w.down[1])
        self.bu5 = RepNCSPELAN4(w.down[1] + w.spp[0], *bu5, n)
        head_ch = (td3[0], bu4[0], bu5[0])
        if w.box_groups > 1:
            self.head: Detect = GroupedDetect(nc, head_ch, self.strides, reg_max, w.box_groups)
        else:
            self.head = Detect(nc, head_ch, self.strides, reg_max)
        self.backbone_channels = (w.p3[0], w.p4[0], w.spp[0])

    def backbone(self, x: torch.Tensor) -> list[torch.Tensor]:
        c3 = self.b3(self.stem(x))
        c4 = self.b4(c3)
        return [c3, c4, self.b5(c4)]

    def neck_head(self, c3: torch.Tensor, c4: torch.Tensor, c5: torch.Tensor) -> torch.Tensor:
        p4 = self.td4(torch.cat((self.up(c5), c4), 1))
        p3 = self.td3(torch.cat((self.up(p4), c3), 1))
        # captured: each head level starts as soon as its input is ready, beside the rest of the neck (nn/streams.py)
        h3 = fork([p3], lambda: self.head.level(0, p3))
        n4 = self.bu4(torch.cat((self.down4(p3), p4), 1))
        h4 = fork([n4], lambda: self.head.level(1, n4))
        n5 = self.bu5(torch.cat((self.down5(n4), c5), 1))
        return self.head.combine([join(h3), join(h4), self.head.level(2, n5)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck_head(*self.backbone(x))

    def feature_shapes(self, h: int, w: int) -> list[tuple[int, int]]:
        """Feature-map sizes for an input of h x w (which the loader keeps a multiple of 32)."""
        return [(h // s, w // s) for s in self.strides]


class TrainNet(nn.Module):
    """What the trainer runs: the detector plus, when enabled, the auxiliary PGI head on backbone features.

    The auxiliary head supervises the shallower backbone levels directly (the small-model form of YOLOv9's
    programmable gradient information); it exists only while training and never reaches saved weights."""

    def __init__(self, net: YOLO9, aux: bool = True):
        super().__init__()
        self.net = net
        self.aux = Detect(net.nc, net.backbone_channels, net.strides, net.reg_max) if aux else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feats = self.net.backbone(x)
        if self.aux is None:
            return (self.net.neck_head(*feats),)
        aux = self.aux
        # captured: the auxiliary head beside the neck and main head, which do not depend on it (nn/streams.py)
        raw, aux_raw = branches(feats, lambda: self.net.neck_head(*feats), lambda: aux(feats)[0])
        return raw, aux_raw
