"""RTMDet loss: dynamic soft label assignment, then quality focal loss over every anchor and class (the target of a
matched anchor's class is its IoU, every other target 0) and GIoU on the matched anchors weighted by that IoU; both
divided by the sum of the matched IoUs (at least 1), as mmdetection's RTMDetHead.

Static shapes and no host synchronisation: background anchors are selected away with torch.where instead of indexed
away, and the normaliser stays a device tensor, so the whole step can be captured."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from libreyolo.families.rtmdet.assigner import EPS_AREA, assign
from libreyolo.nn.head import make_anchors

QFL_BETA = 2.0


def as_raw(outputs: Any) -> torch.Tensor:
    """What the network returns -> its (B, A, 4 + nc) tensor. Also accepts a tuple holding it, and the tuple of
    per-image (A, 4 + nc) tensors that iterating over it gives (a graph runner that makes a tuple of the train
    net's output by iterating it)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    outputs = tuple(outputs)
    if len(outputs) == 1 and outputs[0].dim() == 3:
        return outputs[0]
    return torch.stack(outputs)


def anchor_points(
    imgsz: tuple[int, int], strides: tuple[int, ...], device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (points (A, 2) x, y of every anchor in pixels, strides (A,)): RTMDet's anchors are cell corners (its point
    generator's offset 0), levels in the head's order, row-major. From the shared (cached) grid of cell centres:
    (i + 0.5 - 0.5) * stride is exactly i * stride."""
    shapes = [(imgsz[0] // s, imgsz[1] // s) for s in strides]
    centres, stride = make_anchors(shapes, list(strides), device, dtype)
    return (centres - 0.5) * stride, stride.squeeze(-1)


def decode(dist: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """(..., A, 4) left, top, right, bottom distances in pixels around points (A, 2) -> xyxy pixels."""
    return torch.cat((points - dist[..., :2], points + dist[..., 2:4]), -1)


def giou_aligned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GIoU of matching rows of two xyxy box tensors (..., 4), mmdetection's arithmetic (unions and enclosing areas
    at least EPS_AREA). w * h rather than .prod(-1): prod's backward reads zero counts on the host."""
    wh = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    union = (area_a + area_b - inter).clamp(min=EPS_AREA)
    ewh = (torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])).clamp(min=0)
    enclose = (ewh[..., 0] * ewh[..., 1]).clamp(min=EPS_AREA)
    return inter / union - (enclose - union) / enclose


class RTMDetLoss:
    """Call with the network's raw output and padded targets; returns (loss for backward, detached [qfl, box]
    before their gains)."""

    def __init__(
        self,
        nc: int,
        strides: tuple[int, ...] = (8, 16, 32),
        qfl: float = 1.0,
        box: float = 2.0,
        scale: float = 1.0,
        reduce_normalizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.nc, self.strides = nc, tuple(strides)
        self.gains = (qfl, box)
        self.scale = scale  # 1 / gradient accumulation steps: the accumulated gradient is that of the mean loss
        # under DDP: max(global normaliser, 1) / world size (see distributed/context.py)
        self.reduce_normalizer = reduce_normalizer

    def __call__(
        self, outputs: Any, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """targets (B, M, 5) = class, x1, y1, x2, y2 in input pixels; mask (B, M) bool. batch_scale is not used:
        the loss is a mean over the matched IoU mass, as RTMDet's."""
        raw = as_raw(outputs).float()
        points, strides = anchor_points(imgsz, self.strides, raw.device, raw.dtype)
        dist, logits = raw[..., :4], raw[..., 4:]
        boxes = decode(dist, points)
        a = assign(logits.detach(), boxes.detach(), points, strides, targets[..., 0], targets[..., 1:5], mask)
        fg = a.fg

        norm = a.metric.sum()
        norm = self.reduce_normalizer(norm) if self.reduce_normalizer is not None else norm.clamp(min=1.0)

        # quality focal loss: BCE against the soft target, times |target - p|^beta, over every anchor and class
        onehot = a.labels.unsqueeze(-1) == torch.arange(self.nc, device=raw.device)  # no one_hot: it may sync
        target = torch.where(onehot & fg.unsqueeze(-1), a.metric.unsqueeze(-1), 0.0)
        qfl = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        qfl_loss = (qfl * (target - logits.sigmoid()).abs().pow(QFL_BETA)).sum()

        # GIoU on matched anchors, weighted by the IoU; background rows become one fixed box pair (GIoU 1) before the
        # arithmetic, so nothing they hold (an overflowed distance) reaches the loss or, through where, a gradient
        unit = (torch.arange(4, device=raw.device) // 2).to(boxes.dtype)  # (0, 0, 1, 1), no host-to-device copy
        fg4 = fg.unsqueeze(-1)
        pred = torch.where(fg4, boxes, unit)
        tgt = torch.where(fg4, a.target_boxes.to(boxes.dtype), unit)
        giou_loss = torch.where(fg, (1.0 - giou_aligned(pred, tgt)) * a.metric, 0.0).sum()

        items = torch.stack((qfl_loss, giou_loss)) / norm
        total = items[0] * self.gains[0] + items[1] * self.gains[1]
        return total * self.scale, items.detach()
