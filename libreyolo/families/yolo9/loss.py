"""YOLOv9 detection loss: task-aligned assignment, BCE classification, CIoU box and DFL terms.

Static shapes throughout (see assigner.py): background anchors are weighted by zero instead of
being indexed away, and the target-score normaliser stays a device tensor."""

from __future__ import annotations

from collections.abc import Callable

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
        # under DDP the number-of-targets normaliser is averaged over ranks (see distributed/context.py)
        self.reduce_normalizer = reduce_normalizer
        self._weights: dict[tuple[tuple[float, ...], float, str], torch.Tensor] = {}

    def __call__(
        self,
        raw: torch.Tensor,
        targets: torch.Tensor,
        mask: torch.Tensor,
        imgsz: tuple[int, int],
        batch_scale: float,
        head_weights: tuple[float, ...] = (1.0,),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """raw (H*B, 4R+C, A): the outputs of H heads stacked along the batch (YOLOv9: main, auxiliary);
        targets (B, M, 5) = class, x1, y1, x2, y2 in pixels; mask (B, M) bool.

        All heads go through one assignment and one set of loss kernels (half the launches of two calls);
        each head keeps its own normaliser. Returns (sum over heads of head_weight * weighted loss, times
        batch_scale — the global batch, the Ultralytics convention the default LRs assume; and the first
        head's detached [box, cls, dfl])."""
        raw = raw.float()
        H = len(head_weights)
        if H > 1:
            targets, mask = targets.repeat(H, 1, 1), mask.repeat(H, 1)
        shapes = [(imgsz[0] // s, imgsz[1] // s) for s in self.strides]
        anchors, stride = make_anchors(shapes, list(self.strides), raw.device, raw.dtype)
        anchors_px = make_anchors(shapes, list(self.strides), raw.device, raw.dtype, pixels=True)
        distri, logits = raw.transpose(1, 2).split((4 * self.reg_max, self.nc), -1)
        pred_boxes = dist2bbox(dfl_decode(distri, self.reg_max), anchors)  # grid units

        t_boxes, t_scores, fg = self.assigner(
            logits.detach().sigmoid(),
            pred_boxes.detach() * stride,
            anchors_px,
            targets[..., 0].long(),
            targets[..., 1:5],
            mask,
        )
        normalizer = t_scores.unflatten(0, (H, -1)).sum((1, 2, 3))  # per head
        # under DDP the reducer returns max(global total, 1) / world_size: clamping the local or the averaged
        # value instead would change the gradient whenever the global total is below the world size
        normalizer = (
            self.reduce_normalizer(normalizer) if self.reduce_normalizer is not None else normalizer.clamp(min=1.0)
        )

        cls_sum = (
            F.binary_cross_entropy_with_logits(logits, t_scores, reduction="none").unflatten(0, (H, -1)).sum((1, 2, 3))
        )
        weight = t_scores.sum(-1)  # (H*B, A); zero on background anchors (the assigner's scores are)
        # background anchors target their own (detached, non-degenerate) box: the CIoU's aspect term
        # divides by box height and would put NaN gradients behind the zero weight otherwise
        t_boxes = torch.where(fg.unsqueeze(-1), t_boxes / stride, pred_boxes.detach())
        t_dist = bbox2dist(anchors, t_boxes, self.reg_max)  # (H*B, A, 4)
        per_anchor = torch.stack(
            ((1.0 - ciou(pred_boxes, t_boxes)), _dfl(distri, t_dist, self.reg_max)), -1
        ) * weight.unsqueeze(-1)
        box_dfl = per_anchor.unflatten(0, (H, -1)).sum((1, 2))  # (H, 2)
        items = torch.stack((box_dfl[:, 0], cls_sum, box_dfl[:, 1]), 1) / normalizer.unsqueeze(1)  # (H, 3)
        # sum over heads and terms of head_weight * gain * term, times batch_scale: one weighted sum
        total = (items * self._term_weights(head_weights, batch_scale, items.device)).sum()
        return total, items[0].detach()

    def _term_weights(self, head_weights: tuple[float, ...], batch_scale: float, device: torch.device) -> torch.Tensor:
        """(H, 3) head_weight * gain * batch_scale, made once per setting (filled on the device: no host copy, so a
        graph capture may make it too)."""
        key = (tuple(head_weights), float(batch_scale), str(device))
        w = self._weights.get(key)
        if w is None:
            w = torch.empty(len(head_weights), len(self.gains), device=device)
            for h, hw in enumerate(head_weights):
                for j, g in enumerate(self.gains):
                    w[h, j].fill_(float(hw) * float(g) * float(batch_scale))
            if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
                self._weights[key] = w
        return w


def _dfl(distri: torch.Tensor, target: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Distribution focal loss: cross-entropy to the two bins around each continuous target, mean over sides."""
    logp = distri.unflatten(-1, (4, reg_max)).log_softmax(-1)  # (B, A, 4, R)
    # clamped so that a non-finite prediction gives a NaN loss (skipped by the scaler) instead of an
    # out-of-range gather that kills the CUDA context
    left = target.long().clamp_(0, reg_max - 2)
    right = left + 1
    w_left = right.to(target.dtype) - target
    # both bins in one gather: (B, A, 4, 2) log-probabilities, weighted and summed over the pair
    lp = logp.gather(-1, torch.stack((left, right), -1))
    return -(lp * torch.stack((w_left, 1.0 - w_left), -1)).sum(-1).mean(-1)
