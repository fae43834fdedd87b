"""YOLOv9 detection loss: task-aligned assignment, BCE classification, CIoU box and DFL terms.

Static shapes throughout (see assigner.py): background anchors are weighted by zero instead of
being indexed away, and the target-score normaliser stays a device tensor."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from libreyolo.families.yolo9.assigner import TaskAlignedAssigner
from libreyolo.nn.boxes import ciou
from libreyolo.nn.head import bbox2dist, dfl_decode, dist2bbox, make_anchors


class DetectionLoss:
    """Call with the head's raw logits and padded targets; returns (loss for backward, detached [box, cls, dfl])."""

    def __init__(
        self,
        nc: int,
        strides: tuple[int, ...] = (8, 16, 32),
        reg_max: int = 16,
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        topk: int = 10,
        alpha: float = 0.5,
        beta: float = 6.0,
        reduce_normalizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.nc, self.strides, self.reg_max = nc, tuple(strides), reg_max
        self.gains = (box, cls, dfl)
        self.assigner = TaskAlignedAssigner(nc, topk, alpha, beta)
        # under DDP the number-of-targets normaliser is averaged over ranks (see distributed/)
        self.reduce_normalizer = reduce_normalizer

    def __call__(
        self, raw: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """raw (B, 4R+C, A); targets (B, M, 5) = class, x1, y1, x2, y2 in pixels; mask (B, M) bool.

        batch_scale multiplies the loss (the global batch size, as in the Ultralytics convention that the
        default learning rates assume)."""
        raw = raw.float()
        B = raw.shape[0]
        shapes = [(imgsz[0] // s, imgsz[1] // s) for s in self.strides]
        anchors, stride = make_anchors(shapes, list(self.strides), raw.device, raw.dtype)
        distri, logits = raw.transpose(1, 2).split((4 * self.reg_max, self.nc), -1)
        pred_boxes = dist2bbox(dfl_decode(distri, self.reg_max), anchors)  # grid units

        gt_labels = targets[..., 0].long()
        gt_boxes = targets[..., 1:5]
        t_boxes, t_scores, fg = self.assigner(
            logits.detach().sigmoid(), pred_boxes.detach() * stride, anchors * stride, gt_labels, gt_boxes, mask
        )
        normalizer = t_scores.sum()
        if self.reduce_normalizer is not None:
            normalizer = self.reduce_normalizer(normalizer)
        normalizer = normalizer.clamp(min=1.0)

        loss_cls = F.binary_cross_entropy_with_logits(logits, t_scores, reduction="sum") / normalizer

        weight = t_scores.sum(-1) * fg  # (B, A); zero on background anchors
        # background anchors target their own (detached, non-degenerate) box: the CIoU's aspect term
        # divides by box height and would put NaN gradients behind the zero weight otherwise
        t_boxes = torch.where(fg.unsqueeze(-1), t_boxes / stride, pred_boxes.detach())
        loss_box = ((1.0 - ciou(pred_boxes, t_boxes)) * weight).sum() / normalizer

        t_dist = bbox2dist(anchors, t_boxes, self.reg_max)  # (B, A, 4)
        loss_dfl = (_dfl(distri, t_dist, self.reg_max) * weight).sum() / normalizer

        g_box, g_cls, g_dfl = self.gains
        total = (loss_box * g_box + loss_cls * g_cls + loss_dfl * g_dfl) * batch_scale
        return total, torch.stack((loss_box, loss_cls, loss_dfl)).detach()


def _dfl(distri: torch.Tensor, target: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Distribution focal loss: cross-entropy to the two bins around each continuous target, mean over sides."""
    logp = distri.unflatten(-1, (4, reg_max)).log_softmax(-1)  # (B, A, 4, R)
    # clamped so that a non-finite prediction gives a NaN loss (skipped by the scaler) instead of an
    # out-of-range gather that kills the CUDA context
    left = target.long().clamp_(0, reg_max - 2)
    w_left = (left + 1).to(target.dtype) - target
    lp = logp.gather(-1, left.unsqueeze(-1)).squeeze(-1)
    rp = logp.gather(-1, (left + 1).unsqueeze(-1)).squeeze(-1)
    return -(lp * w_left + rp * (1.0 - w_left)).mean(-1)
