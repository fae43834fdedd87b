"""Anchor-free decoupled detection head with Distribution Focal Loss (DFL) box regression."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from libreyolo.nn.blocks import Conv
from libreyolo.nn.streams import branches, forking

_CONSTANTS: dict[tuple, Any] = {}


def _constant(key: tuple, device: torch.device, build: Any) -> Any:
    """`build()`, made once per key: the anchor grid and the DFL bins only depend on sizes, so a training
    step does not rebuild them (a dozen small kernels per step for nothing). Never cached while a CUDA
    graph is being captured: that tensor would live in the graph's private memory pool."""
    hit = _CONSTANTS.get(key)
    if hit is not None:
        return hit
    out = build()
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        _CONSTANTS[key] = out
    return out


def make_anchors(
    shapes: list[tuple[int, int]], strides: list[int], device: torch.device, dtype: torch.dtype, pixels: bool = False
) -> Any:
    """Grid-cell centres (A, 2) in feature units and their strides (A, 1), for all levels concatenated;
    with pixels=True, the centres in input pixels (A, 2) alone. Cached per (shapes, device, dtype)."""

    def build() -> Any:
        points, stride_t = [], []
        for (h, w), s in zip(shapes, strides):
            sy, sx = torch.meshgrid(
                torch.arange(h, device=device, dtype=dtype) + 0.5,
                torch.arange(w, device=device, dtype=dtype) + 0.5,
                indexing="ij",
            )
            points.append(torch.stack((sx, sy), -1).view(-1, 2))
            stride_t.append(torch.full((h * w, 1), s, dtype=dtype, device=device))
        out = (torch.cat(points), torch.cat(stride_t))
        return out[0] * out[1] if pixels else out

    return _constant(("anchors", tuple(shapes), tuple(strides), str(device), dtype, pixels), device, build)


def dfl_decode(distri: torch.Tensor, reg_max: int) -> torch.Tensor:
    """(..., 4*reg_max) logits -> (..., 4) expected distances (left, top, right, bottom) in grid units."""
    p = distri.unflatten(-1, (4, reg_max)).softmax(-1)
    dev, dt = distri.device, distri.dtype
    return p @ _constant(("bins", reg_max, str(dev), dt), dev, lambda: torch.arange(reg_max, device=dev, dtype=dt))


def dist2bbox(dist: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """ltrb distances around anchor points -> xyxy boxes."""
    lt, rb = dist.chunk(2, -1)
    return torch.cat((anchors - lt, anchors + rb), -1)


def bbox2dist(anchors: torch.Tensor, boxes: torch.Tensor, reg_max: int) -> torch.Tensor:
    """xyxy boxes -> ltrb distances from anchor points, clamped into the DFL range."""
    x1y1, x2y2 = boxes.chunk(2, -1)
    return torch.cat((anchors - x1y1, x2y2 - anchors), -1).clamp_(0, reg_max - 1.01)


class Detect(nn.Module):
    """One box branch and one class branch per level; outputs raw (B, 4*reg_max + nc, A) logits."""

    def __init__(self, nc: int, ch: tuple[int, ...], strides: tuple[int, ...] = (8, 16, 32), reg_max: int = 16):
        super().__init__()
        self.nc, self.reg_max, self.strides = nc, reg_max, tuple(strides)
        self.no = nc + 4 * reg_max
        c2 = max(16, ch[0] // 4, reg_max * 4)
        c3 = max(ch[0], min(nc, 100))
        self.box = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for c in ch
        )
        self.cls = nn.ModuleList(nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for c in ch)
        self.reset_bias()

    def reset_bias(self, imgsz: int = 640) -> None:
        """Box logits start flat; class logits start at a low prior (about 5 objects per image)."""
        for b, c, s in zip(self.box, self.cls, self.strides):
            nn.init.constant_(b[-1].bias, 1.0)
            nn.init.constant_(c[-1].bias, math.log(5 / self.nc / (imgsz / s) ** 2))

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        if forking(feats[0]):  # captured: the levels side by side (nn/streams.py)
            outs = branches(feats, *(functools.partial(self.level, k, x) for k, x in enumerate(feats)))
        else:
            outs = [self.level(k, x) for k, x in enumerate(feats)]
        return self.combine(outs), [(x.shape[2], x.shape[3]) for x in feats]

    def level(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Level k's raw logits (B, 4*reg_max + nc, H*W); captured, its box and class branches side by side."""
        if forking(x):
            box, cls = branches([x], functools.partial(self.box[k], x), functools.partial(self.cls[k], x))
        else:
            box, cls = self.box[k](x), self.cls[k](x)
        return torch.cat((box, cls), 1).flatten(2)

    def combine(self, levels: list[torch.Tensor]) -> torch.Tensor:
        """The levels' logits -> (B, 4*reg_max + nc, A)."""
        return torch.cat(levels, 2)

    def decode(self, raw: torch.Tensor, shapes: list[tuple[int, int]]) -> torch.Tensor:
        """Raw logits -> (B, A, 4 + nc): xyxy boxes in input pixels and class probabilities."""
        anchors, stride = make_anchors(shapes, list(self.strides), raw.device, raw.dtype)
        distri, logits = raw.transpose(1, 2).split((4 * self.reg_max, self.nc), -1)
        boxes = dist2bbox(dfl_decode(distri, self.reg_max), anchors) * stride
        return torch.cat((boxes, logits.sigmoid()), -1)
