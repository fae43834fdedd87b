"""Complete-IoU on broadcastable box tensors.

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
