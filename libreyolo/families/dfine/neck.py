"""D-FINE's encoder blocks where they differ from RT-DETR's: CCFM fuses with a GELAN-style block (RepNCSPELAN4 of
YOLOv9, built here from RT-DETR's CSP-of-RepVGG block) and downsamples with SCDown (a 1x1 conv, then a depthwise
3x3 of stride 2). The encoder itself is RT-DETR's HybridEncoder with these blocks."""

from __future__ import annotations

import torch
from torch import nn

from libreyolo.families.rtdetr.encoder import ConvNorm, CSPRep


class ElanFuse(nn.Module):
    """c1 -> 1x1 to c3, split in halves; the second half through two (CSP block, 3x3 conv) stages of width c4;
    both halves and both stages' outputs concatenated and projected to c2 by a 1x1."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, n: int):
        super().__init__()
        self.split = c3 // 2
        self.cv1 = ConvNorm(c1, c3, 1)
        self.cv2 = nn.Sequential(CSPRep(c3 // 2, c4, n), ConvNorm(c4, c4, 3))
        self.cv3 = nn.Sequential(CSPRep(c4, c4, n), ConvNorm(c4, c4, 3))
        self.cv4 = ConvNorm(c3 + 2 * c4, c2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).split((self.split, self.split), 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


def elan(hidden: int, expansion: float, depth: float) -> nn.Module:
    """The fusion block of a D-FINE size: 2 x hidden channels in, hidden out; its CSP width and depth scale with
    the size's expansion and depth multiplier as in the official configs."""
    return ElanFuse(2 * hidden, hidden, 2 * hidden, round(expansion * hidden // 2), round(3 * depth))


def scdown(c: int) -> nn.Module:
    return nn.Sequential(ConvNorm(c, c, 1, act=False), ConvNorm(c, c, 3, 2, act=False, g=c))
