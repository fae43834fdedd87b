"""RT-DETR loss: varifocal classification (IoU-aware soft targets), L1 and GIoU box terms, summed over every
decoder layer, the encoder's top-k output and the denoising groups, each normalised by the number of ground
truths (the denoising groups by that times the group count).

The matching queries are assigned by the Hungarian matcher (matcher.py: one batched cost, one copy to the host);
the denoising queries need no matching, their ground truth is known by construction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torchvision.ops import box_iou, generalized_box_iou_loss

from libreyolo.families.rtdetr.denoising import pack_targets
from libreyolo.families.rtdetr.matcher import cxcywh_to_xyxy, hungarian, match_costs


def prediction_sets(outputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Training dict or eval (logits, boxes) -> (logits (S, B, Q, C), boxes (S, B, Q, 4)) of the matched sets."""
    if isinstance(outputs, dict):
        logits = torch.cat((outputs["logits"].float(), outputs["enc_logits"][None].float()))
        boxes = torch.cat((outputs["boxes"].float(), outputs["enc_boxes"][None].float()))
        return logits, boxes
    logits, boxes = outputs
    return logits[None].float(), boxes[None].float()


class RTDETRLoss:
    """Call with the network's output and padded targets; returns (loss for backward, detached [vfl, bbox, giou]
    before their gains)."""

    def __init__(
        self,
        nc: int,
        vfl: float = 1.0,
        bbox: float = 5.0,
        giou: float = 2.0,
        alpha: float = 0.75,
        gamma: float = 2.0,
        scale: float = 1.0,
        reduce_normalizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.nc, self.gains, self.alpha, self.gamma = nc, (vfl, bbox, giou), alpha, gamma
        self.scale = scale  # 1 / gradient accumulation steps: the clip norm applies to a mean gradient
        self.reduce_normalizer = reduce_normalizer

    def __call__(
        self, outputs: Any, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cls, tboxes, valid = pack_targets(targets, mask, imgsz)
        counts = valid.sum(1)
        n = counts.sum().float()
        n = self.reduce_normalizer(n) if self.reduce_normalizer is not None else n.clamp(min=1.0)
        logits, boxes = prediction_sets(outputs)
        cost = match_costs(logits, boxes, cls, tboxes)
        s, b, q, g = hungarian(cost, counts.tolist())
        items = self.terms(logits, boxes, (s, b, q), cls[b, g], tboxes[b, g], n)
        if isinstance(outputs, dict) and "dn_logits" in outputs:
            dn_logits, dn_boxes = outputs["dn_logits"].float(), outputs["dn_boxes"].float()
            G = valid.shape[1]
            groups = dn_logits.shape[2] // (2 * G)
            # layer, image, group, slot of every valid ground truth's positive copy
            L = dn_logits.shape[0]
            keep = valid[None, :, None, :].expand(L, -1, groups, -1)
            l_i, b_i, k_i, j_i = keep.nonzero(as_tuple=True)
            q_i = k_i * 2 * G + j_i
            items = items + self.terms(dn_logits, dn_boxes, (l_i, b_i, q_i), cls[b_i, j_i], tboxes[b_i, j_i], n * groups)
        vfl, bbox, giou = self.gains
        total = items[0] * vfl + items[1] * bbox + items[2] * giou
        return total * self.scale, items.detach()

    def terms(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        idx: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        t_cls: torch.Tensor,
        t_boxes: torch.Tensor,
        n: torch.Tensor,
    ) -> torch.Tensor:
        """Sets of predictions (S, B, Q, .) and their matched pairs (set, image, query index tensors, with each
        pair's class and box) -> [vfl, l1, giou] summed over the sets, divided by n."""
        src = boxes[idx]
        src_xyxy, t_xyxy = cxcywh_to_xyxy(src), cxcywh_to_xyxy(t_boxes)
        iou = box_iou(src_xyxy.detach(), t_xyxy).diagonal() if len(src) else src.new_zeros(0)
        onehot = torch.zeros_like(logits)
        onehot[(*idx, t_cls)] = 1.0
        score = torch.zeros_like(logits)
        score[(*idx, t_cls)] = iou.to(score.dtype)
        # varifocal: negatives weighted by alpha * p^gamma, positives by their IoU target
        p = logits.detach().sigmoid()
        weight = self.alpha * p.pow(self.gamma) * (1 - onehot) + score
        vfl = F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="sum")
        l1 = F.l1_loss(src, t_boxes, reduction="sum")
        giou = generalized_box_iou_loss(src_xyxy, t_xyxy, reduction="sum") if len(src) else src.sum()
        return torch.stack((vfl, l1, giou)) / n
