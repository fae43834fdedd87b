"""RTMDet's dynamic soft label assignment, batched over images and padded ground truths, with static shapes.

The assignment (mmdetection's DynamicSoftLabelAssigner, per image there): the candidates of an image are the anchors
whose point lies inside any of its boxes; a (ground truth, candidate) pair costs a soft classification term (the BCE
of the class logit against the IoU as a soft label, scaled by the squared gap between them, over all classes) plus
3 * -log(IoU) plus a soft centre prior 10^(distance to the box centre in strides - 3); each ground truth takes its
k cheapest candidates, k the floor of the sum of its 13 best candidate IoUs (at least 1), and an anchor wanted by
several ground truths goes to the one it costs least.

Here every step is a fixed-shape tensor operation over (B, M, A) (images, padded ground truths, anchors): a pair
that is no candidate costs infinity instead of being indexed away, "the k cheapest" is a fixed top-13 with a rank
mask (k is a sum of 13 IoUs: never above 13), the class term is summed without a (B, M, A, C) tensor, and nothing
waits for the host, so the whole training step can be one CUDA graph.

One difference from mmdetection: the centre prior's exponent is capped at 30. Uncapped, a candidate more than ~41
strides from a box's centre costs float32 infinity, and infinities tie: which of them a ground truth takes then
depends on the sort. Capped, such pairs still cost more than any near one (by 10^27 at least), and their order
among themselves follows the other two terms."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from libreyolo.nn.boxes import pairwise_overlap

TOPK = 13  # IoUs summed for the dynamic k, which is therefore at most 13
IOU_WEIGHT = 3.0
CENTER_RADIUS = 3.0  # the soft centre prior is 1 at this distance (in strides) from the box centre
MAX_CENTER_EXP = 30.0
EPS_LOG = 1e-7  # -log(IoU + this): the IoU cost of a pair that does not overlap is finite
EPS_AREA = 1e-6  # unions and enclosing areas are at least this (mmdetection's bbox_overlaps)


@dataclass
class Assignment:
    fg: torch.Tensor  # (B, A) bool: the anchor is matched to a ground truth
    gt_index: torch.Tensor  # (B, A) long: index of the matched ground truth (0 on background anchors)
    labels: torch.Tensor  # (B, A) long: class of the matched ground truth (0 on background anchors)
    target_boxes: torch.Tensor  # (B, A, 4) xyxy pixels of the matched ground truth (of ground truth 0 on background)
    metric: torch.Tensor  # (B, A): IoU of the prediction with its matched ground truth; 0 on background


def pairwise_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (B, M, 4), b (B, A, 4) xyxy -> IoU (B, M, A), mmdetection's arithmetic (areas not clamped, the union at
    least EPS_AREA): a predicted box may be inverted (a distance head without exp can output negative distances)."""
    inter, area_a, area_b = pairwise_overlap(a, b)
    return inter / (area_a + area_b - inter).clamp(min=EPS_AREA)


def soft_class_cost(logits: torch.Tensor, iou: torch.Tensor, gt_cls: torch.Tensor) -> torch.Tensor:
    """sum over classes c of BCE(x_c, t_c) * |t_c - sigmoid(x_c)|^2 with t the one-hot of the ground truth's class
    times the pair's IoU, for every (ground truth, anchor) pair -> (B, M, A). For c other than the class g the
    target is 0 and the term softplus(x_c) * sigmoid(x_c)^2 does not depend on the pair: the sum is that term summed
    over all classes, minus its value at g, plus the true term at g."""
    x = logits.to(iou.dtype)  # (B, A, C)
    s = x.sigmoid()
    neg = F.softplus(x) * s.square()  # BCE(x, 0) * |0 - s|^2
    idx = gt_cls.long().unsqueeze(-1).expand(-1, -1, x.shape[1])  # (B, M, A)
    # the (B, M, A) terms one after another, in place (the assignment runs without autograd): the same arithmetic
    pos_g = F.binary_cross_entropy_with_logits(x.transpose(1, 2).gather(1, idx), iou, reduction="none")
    pos_g *= (iou - s.transpose(1, 2).gather(1, idx)).square_()
    neg_g = neg.transpose(1, 2).gather(1, idx)
    return neg_g.neg_().add_(neg.sum(-1).unsqueeze(1)).add_(pos_g)  # sum - neg_g + pos_g


@torch.no_grad()
def assign(
    cls_logits: torch.Tensor,
    pred_boxes: torch.Tensor,
    points: torch.Tensor,
    strides: torch.Tensor,
    gt_cls: torch.Tensor,
    gt_boxes: torch.Tensor,
    mask: torch.Tensor,
) -> Assignment:
    """cls_logits (B, A, C), pred_boxes (B, A, 4) xyxy pixels; points (A, 2) (the anchors' cell corners) and strides
    (A,) in pixels; gt_cls (B, M), gt_boxes (B, M, 4) xyxy pixels, mask (B, M) bool (padding False). Computes in the
    dtype of pred_boxes (the loss passes float32)."""
    B, A, _ = cls_logits.shape
    if gt_boxes.shape[1] == 0:  # no room for any gt: one padded slot keeps every reduction over M defined
        gt_cls, gt_boxes, mask = gt_cls.new_zeros(B, 1), pred_boxes.new_zeros(B, 1, 4), mask.new_zeros(B, 1)
    gt_boxes = gt_boxes.to(pred_boxes.dtype)
    gt_cls = torch.where(mask, gt_cls.long(), 0)  # a padded slot's class may be anything: never gathered with
    valid = mask.unsqueeze(-1)  # (B, M, 1)
    x, y = points[:, 0], points[:, 1]
    x1, y1, x2, y2 = (gt_boxes[..., i, None] for i in range(4))  # (B, M, 1)
    # every distance to a side above 0, one side at a time: (B, M, A) temporaries, not a (B, M, A, 4) stack (at 256
    # target slots, batch 16, 640 px, a (B, M, A) float32 tensor is 138 MB)
    inside = (x - x1) > 0  # (B, M, A)
    inside &= (y - y1) > 0
    inside &= (x2 - x) > 0
    inside &= (y2 - y) > 0
    candidate = (inside & valid).any(1, keepdim=True)  # (B, 1, A): inside any box of the image
    pair = candidate & valid

    iou = pairwise_iou(gt_boxes, pred_boxes)
    # the same arithmetic as on (B, M, A, 2) centre offsets, coordinate by coordinate and in place
    distance = (x - (x1 + x2) / 2).square_().add_((y - (y1 + y2) / 2).square_()).sqrt_().div_(strides)  # in strides
    centre_cost = torch.pow(10.0, distance.sub_(CENTER_RADIUS).clamp_(max=MAX_CENTER_EXP))
    del distance
    cost = soft_class_cost(cls_logits, iou, gt_cls).add_((iou + EPS_LOG).log_().neg_().mul_(IOU_WEIGHT))
    cost += centre_cost
    del centre_cost

    k = min(TOPK, A)
    # dynamic k: the sum of each gt's 13 best candidate IoUs (zeros pad a short list: the same sum)
    dyn_k = torch.where(pair, iou, 0.0).topk(k, -1).values.sum(-1).floor().clamp(min=1)  # (B, M)
    inf = torch.full((), float("inf"), device=cost.device, dtype=cost.dtype)
    vals, idx = torch.where(pair, cost, inf).topk(k, -1, largest=False)  # (B, M, k), cheapest first
    rank = torch.arange(k, device=cost.device)
    take = (rank < dyn_k.unsqueeze(-1)) & vals.isfinite()  # a gt has at least dyn_k candidates: all finite
    # add, not set: an unused entry's index may repeat a taken one, and scatter_ with duplicates is undefined
    claims = torch.zeros_like(cost).scatter_add_(-1, idx, take.to(cost.dtype))  # (B, M, A), 0/1
    n_claims = claims.sum(1)  # (B, A)

    # an anchor claimed by several gts goes to the one of lowest cost among all the image's gts
    best = torch.where(valid, cost, inf).argmin(1)  # (B, A)
    fg = n_claims > 0
    gt_index = torch.where(n_claims > 1, best, claims.argmax(1))
    gt_index = torch.where(fg, gt_index, 0)

    # where, not a product: a padded gt's IoU may be anything
    metric = torch.where(fg, iou.gather(1, gt_index.unsqueeze(1)).squeeze(1), 0.0)  # (B, A)
    labels = torch.where(fg, gt_cls.gather(1, gt_index), 0)
    target_boxes = gt_boxes.gather(1, gt_index.unsqueeze(-1).expand(-1, -1, 4))
    return Assignment(fg, gt_index, labels, target_boxes, metric)
