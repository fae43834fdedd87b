"""The YOLOv9 (GELAN) detector: backbone, PAN neck and DFL head; plus the auxiliary (PGI) training head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.nn.blocks import ELAN1, SPPELAN, ADown, Conv, RepNCSPELAN4
from libreyolo.nn.head import Detect
from libreyolo.nn.streams import branches, fork, join


@dataclass(frozen=True)
class Widths:
    stem: tuple[int, int]
    elan1: tuple[int, int, int]
    p3: tuple[int, int, int]
    p4: tuple[int, int, int]
    p5: tuple[int, int, int]
    spp: tuple[int, int]
    down: tuple[int, int]  # neck downsamplers P3->P4, P4->P5
    n: int = 3


SIZES: dict[str, Widths] = {
    "t": Widths((16, 32), (32, 32, 16), (64, 64, 32), (96, 96, 48), (128, 128, 64), (128, 64), (48, 64)),
    "s": Widths((32, 64), (64, 64, 32), (128, 128, 64), (192, 192, 96), (256, 256, 128), (256, 128), (96, 128)),
}


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
        # backbone
        self.stem = nn.Sequential(
            Conv(3, w.stem[0], 3, 2), Conv(w.stem[0], w.stem[1], 3, 2), ELAN1(w.stem[1], *w.elan1)
        )
        self.b3 = nn.Sequential(ADown(w.elan1[0], w.p3[0]), RepNCSPELAN4(w.p3[0], *w.p3, n))
        self.b4 = nn.Sequential(ADown(w.p3[0], w.p4[0]), RepNCSPELAN4(w.p4[0], *w.p4, n))
        self.b5 = nn.Sequential(ADown(w.p4[0], w.p5[0]), RepNCSPELAN4(w.p5[0], *w.p5, n), SPPELAN(w.p5[0], *w.spp))
        # neck: top-down then bottom-up
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.td4 = RepNCSPELAN4(w.spp[0] + w.p4[0], *w.p4, n)
        self.td3 = RepNCSPELAN4(w.p4[0] + w.p3[0], *w.p3, n)
        self.down4 = ADown(w.p3[0], w.down[0])
        self.bu4 = RepNCSPELAN4(w.down[0] + w.p4[0], *w.p4, n)
        self.down5 = ADown(w.p4[0], w.down[1])
        self.bu5 = RepNCSPELAN4(w.down[1] + w.spp[0], *w.p5, n)
        self.head = Detect(nc, (w.p3[0], w.p4[0], w.p5[0]), self.strides, reg_max)
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
