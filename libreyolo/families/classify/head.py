"""What the classifiers share: cross-entropy with label smoothing, and logits -> top-k (class, probability)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class ClassifyLoss:
    """Cross-entropy with label smoothing over each image's class. The classify data pipeline hands the class as
    the first target row's class (targets[:, 0, 0], mask[:, 0] true; the engine's (B, M, 5) targets with M
    padding rows): no per-task collate, static shapes, no host synchronisation, so `cuda_graph=full` captures
    the whole step. Images with mask[:, 0] false (validation's padding images) weigh nothing. The loss is the
    mean over images: batch_scale is not applied (the LR of optimizer=auto and the family's defaults assume a
    mean), so the logged term is the familiar per-image cross-entropy."""

    def __init__(self, label_smoothing: float):
        self.label_smoothing = label_smoothing

    def __call__(
        self, outputs: Any, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = outputs.float()
        labels = targets[:, 0, 0].long()
        weight = mask[:, 0].to(logits.dtype)
        ce = F.cross_entropy(logits, labels, reduction="none", label_smoothing=self.label_smoothing)
        loss = (ce * weight).sum() / weight.sum().clamp(min=1.0)
        return loss, loss.detach().reshape(1)


def topk(
    net: nn.Module,
    raw: Any,
    imgsz: tuple[int, int],
    conf: float = 0.0,
    iou: float = 0.0,
    max_det: int = 5,
    multi_label: bool = False,
) -> torch.Tensor:
    """The classifier's `postprocess`: logits (B, nc) -> (B, k, 2) class index and softmax probability, best
    first, k = min(max_det, nc). conf, iou and multi_label are the detection contract's and do not apply."""
    prob = raw.float().softmax(1)
    scores, classes = prob.topk(min(max_det, prob.shape[1]), dim=1)
    return torch.stack((classes.to(scores.dtype), scores), 2)
