"""Complete-IoU on broadcastable box tensors, and the pairwise overlap the assigners build their costs on.

torchvision.ops.complete_box_iou_loss computes the same quantity, but it indexes with a boolean mask
internally: that is a host synchronisation on every call and cannot be captured in a CUDA graph, and it
does not broadcast. This version is branch-free and broadcasts; tests check it against torchvision."""

from __future__ import annotations

import math

import torch


def ciou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """CIoU of xyxy boxes (..., 4) and (..., 4), broadcast; the aspect-ratio weight is not differentiated.

    The x and y coordinates go through each step together as (..., 2) pairs: the same arithmetic, in the same
    order, as coordinate by coordinate (bit for bit, gradients included), in 41 ops instead of 55 and a backward
    of 79 instead of 117 (the loss runs it twice per step: assignment and box loss)."""
    (a1, a2), (b1, b2) = box1.unflatten(-1, (2, 2)).unbind(-2), box2.unflatten(-1, (2, 2)).unbind(-2)  # x1y1, x2y2
    wh1, wh2 = a2 - a1, b2 - b1
    w1, h1 = wh1.unbind(-1)
    w2, h2 = wh2.unbind(-1)
    iw, ih = (torch.minimum(a2, b2) - torch.maximum(a1, b1)).clamp(min=0).unbind(-1)
    inter = iw * ih
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    c2 = (torch.maximum(a2, b2) - torch.minimum(a1, b1)).pow(2).sum(-1) + eps  # enclosing box diagonal squared
    rho2 = (b1 + b2 - a1 - a2).pow(2).sum(-1) / 4  # centre distance squared
    v = (4 / math.pi**2) * (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def pairwise_overlap(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """xyxy boxes a (B, M, 4) and b (B, A, 4) -> the intersection area of every pair (B, M, A) and the boxes' own
    areas (B, M, 1) and (B, 1, A), not clamped (a predicted box may be inverted). Coordinate by coordinate, in place
    where a value is not read again: the temporaries are (B, M, A) tensors, not (B, M, A, 2) pairs (at 152 target
    slots, 150 objects, batch 16, 640 px, one (B, M, A) float32 tensor is 82 MB, 163 MB with YOLOv9's aux head)."""
    ax1, ay1, ax2, ay2 = a.unsqueeze(2).unbind(-1)  # (B, M, 1) each
    bx1, by1, bx2, by2 = b.unsqueeze(1).unbind(-1)  # (B, 1, A) each
    inter = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp_(min=0)
    inter *= (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp_(min=0)
    return inter, (ax2 - ax1) * (ay2 - ay1), (bx2 - bx1) * (by2 - by1)
