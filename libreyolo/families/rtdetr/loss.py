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

    capturable = False  # the matching copies costs to the host: a validation graph holds the network only

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
        cls, tboxes, valid, counts = pack_targets(targets, mask, imgsz)
        n = valid.sum().float()
        n = self.reduce_normalizer(n) if self.reduce_normalizer is not None else n.clamp(min=1.0)
        logits, boxes = prediction_sets(outputs)
        cost = match_costs(logits, boxes, cls, tboxes)
        s, b, q, g = hungarian(cost, counts)
        items = self.terms(logits, boxes, (s, b, q), cls[b, g], tboxes[b, g], n)
        if isinstance(outputs, dict) and "dn_logits" in outputs:
            dn_logits, dn_boxes = outputs["dn_logits"].float(), outputs["dn_boxes"].float()
            L, B, N, _ = dn_logits.shape
            G = valid.shape[1]
            groups = N // (2 * G)
            # every (layer, image, group, slot) positive copy, padding slots included with weight 0: static
            # index tensors, no nonzero() (a padding slot's query is its own; a zero target there is right)
            shape = (L, B, groups, G)
            dev = dn_logits.device
            l_i = torch.arange(L, device=dev).view(L, 1, 1, 1).expand(shape).flatten()
            b_i = torch.arange(B, device=dev).view(1, B, 1, 1).expand(shape).flatten()
            k_i = torch.arange(groups, device=dev).view(1, 1, groups, 1).expand(shape)
            j_i = torch.arange(G, device=dev).view(1, 1, 1, G).expand(shape)
            q_i = (k_i * 2 * G + j_i).flatten()
            j_i = j_i.flatten()
            w = valid[b_i, j_i].float()
            dn_items = self.terms(dn_logits, dn_boxes, (l_i, b_i, q_i), cls[b_i, j_i], tboxes[b_i, j_i], n * groups, w)
            items = items + dn_items
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
        w: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sets of predictions (S, B, Q, .) and their matched pairs (set, image, query index tensors, with each
        pair's class and box; w: a 0/1 weight per pair) -> [vfl, l1, giou] summed over the sets, divided by n."""
        src = boxes[idx]
        w = w if w is not None else src.new_ones(len(src))
        iou = aligned_iou(cxcywh_to_xyxy(src.detach()), cxcywh_to_xyxy(t_boxes))
        vfl = varifocal(logits, idx, t_cls, iou, w, self.alpha, self.gamma)
        return torch.stack((vfl, *box_terms(src, t_boxes, w))) / n


def varifocal(
    logits: torch.Tensor,
    idx: tuple[torch.Tensor, ...],
    t_cls: torch.Tensor,
    iou: torch.Tensor,
    w: torch.Tensor,
    alpha: float = 0.75,
    gamma: float = 2.0,
) -> torch.Tensor:
    """Varifocal loss summed over a set of logits (S, B, Q, C) whose matched (set, image, query) pairs `idx`
    have class t_cls and IoU target iou (w: a 0/1 weight per pair): negatives weighted by alpha * p^gamma,
    positives by their IoU target."""
    at = (*idx, t_cls)
    onehot = torch.zeros_like(logits)
    onehot[at] = w.to(logits.dtype)
    score = torch.zeros_like(logits)
    score[at] = (iou * w).to(logits.dtype)
    p = logits.detach().sigmoid()
    weight = alpha * p.pow(gamma) * (1 - onehot) + score
    return F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="sum")


def box_terms(src: torch.Tensor, t_boxes: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Matched (P, 4) cx, cy, w, h boxes and their targets -> (L1 sum, GIoU loss sum), each pair weighted by w."""
    from torchvision.ops import generalized_box_iou_loss  # here, not at import: see backbone.py

    l1 = ((src - t_boxes).abs().sum(-1) * w).sum()
    giou = (generalized_box_iou_loss(cxcywh_to_xyxy(src), cxcywh_to_xyxy(t_boxes)) * w).sum() if len(src) else src.sum()
    return l1, giou


def aligned_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of matching rows of two (P, 4) xyxy tensors (torchvision's box_iou is pairwise: P x P)."""
    wh = (torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    area = (a[:, 2:] - a[:, :2]).prod(-1) + (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area - inter).clamp(min=1e-9)
