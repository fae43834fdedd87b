"""SimOTA label assignment (YOLOX), batched over images and padded ground truths, with static shapes.

YOLOX assigns image by image: it gathers the candidate anchors with boolean masks, takes each ground truth's
dynamic k with `.tolist()` and loops over ground truths. Here every step is a fixed-shape tensor operation
over (B, M, A) (images, padded ground truths, anchors): a non-candidate pair gets an infinite cost instead of
being indexed away, "the dynamic-k lowest costs" is a fixed top-10 with a rank mask (k never exceeds 10: it is
a sum of ten IoUs), and nothing waits for the host. So the whole training step can be one CUDA graph.

YOLOX adds a 1e5 penalty to the cost of a pair whose anchor is not both in the box and near its centre. In
float32 that addition rounds away the cost's last bits (1e5 has an ulp of ~0.008), so penalised anchors tie
more or less at random. Here the penalty is applied exactly: a penalised pair always ranks after every
unpenalised one, and by its unrounded cost among the penalised ones (the exact-arithmetic meaning of YOLOX's
cost)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from libreyolo.nn.boxes import pairwise_overlap

CENTER_RADIUS = 2.5  # in strides: anchors this close to a box centre are candidates too
TOPK = 10  # IoUs summed for the dynamic k, which is therefore at most 10
IOU_WEIGHT = 3.0
EPS_LOG = 1e-8
LOG_CLAMP = -100.0  # what binary_cross_entropy clamps log(p) to


@dataclass
class Assignment:
    fg: torch.Tensor  # (B, A) bool: the anchor is matched to a ground truth
    gt_index: torch.Tensor  # (B, A) long: index of the matched ground truth (0 on background anchors)
    target_cls: torch.Tensor  # (B, A, C): one-hot of the matched class times the IoU of the match; 0 on background
    target_boxes: torch.Tensor  # (B, A, 4) xyxy pixels of the matched ground truth (of ground truth 0 on background)
    iou: torch.Tensor  # (B, A): IoU between the prediction and its matched ground truth; 0 on background


def pairwise_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (B, M, 4), b (B, A, 4) xyxy -> IoU (B, M, A). Without an epsilon, as YOLOX's bboxes_iou: predicted
    boxes (exp of the size output) always have an area."""
    inter, area_a, area_b = pairwise_overlap(a, b)
    return inter / (area_a + area_b - inter)


def geometry(gt: torch.Tensor, centres: torch.Tensor, strides: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gt (B, M, 4) xyxy, anchor centres (A, 2) and strides (A,) in pixels -> (in box, in centre region),
    each (B, M, A) bool; strict inequalities, as YOLOX (every distance to a side above 0)."""
    x, y = centres[:, 0], centres[:, 1]
    x1, y1, x2, y2 = (gt[..., i, None] for i in range(4))
    in_box = (x - x1) > 0
    in_box &= (y - y1) > 0
    in_box &= (x2 - x) > 0
    in_box &= (y2 - y) > 0
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    r = CENTER_RADIUS * strides
    in_ctr = (x - (cx - r)) > 0
    in_ctr &= (y - (cy - r)) > 0
    in_ctr &= ((cx + r) - x) > 0
    in_ctr &= ((cy + r) - y) > 0
    return in_box, in_ctr


def class_cost(cls_logits: torch.Tensor, obj_logits: torch.Tensor, gt_cls: torch.Tensor) -> torch.Tensor:
    """YOLOX's cls cost: BCE between p = sqrt(sigmoid(cls) * sigmoid(obj)) and the gt's one-hot class,
    summed over classes, for every (gt, anchor) pair -> (B, M, A). Computed without a (B, M, A, C) tensor:
    sum_c BCE = sum_c -log(1 - p_c) + log(1 - p_g) - log(p_g), g the gt's class (logs clamped at -100, as
    binary_cross_entropy clamps them)."""
    p = (cls_logits.float().sigmoid() * obj_logits.float().sigmoid().unsqueeze(-1)).sqrt()  # (B, A, C)
    log_q = torch.log1p(-p).clamp(min=LOG_CLAMP)  # log(1 - p)
    log_p = p.log().clamp(min=LOG_CLAMP)
    idx = gt_cls.long().unsqueeze(-1).expand(-1, -1, p.shape[1])  # (B, M, A)
    per_pair = (log_q - log_p).transpose(1, 2).gather(1, idx)
    return per_pair.sub_(log_q.sum(-1).unsqueeze(1))  # in place: the assignment runs without autograd


@torch.no_grad()
def simota(
    cls_logits: torch.Tensor,
    obj_logits: torch.Tensor,
    pred_boxes: torch.Tensor,
    centres: torch.Tensor,
    strides: torch.Tensor,
    gt_cls: torch.Tensor,
    gt_boxes: torch.Tensor,
    mask: torch.Tensor,
) -> Assignment:
    """cls_logits (B, A, C), obj_logits (B, A), pred_boxes (B, A, 4) xyxy pixels; centres (A, 2) and strides (A,)
    of the anchors in pixels; gt_cls (B, M), gt_boxes (B, M, 4) xyxy pixels, mask (B, M) bool (padding False)."""
    B, A, C = cls_logits.shape
    if gt_boxes.shape[1] == 0:  # no room for any gt: one padded slot keeps every reduction over M defined
        gt_cls, gt_boxes, mask = gt_cls.new_zeros(B, 1), gt_boxes.new_zeros(B, 1, 4), mask.new_zeros(B, 1)
    pred_boxes = pred_boxes.float()
    gt_boxes = gt_boxes.float()
    valid = mask.unsqueeze(-1)  # (B, M, 1)
    in_box, in_ctr = geometry(gt_boxes, centres.float(), strides.float())
    # an anchor is a candidate for every gt of its image once it is near any of them (YOLOX's union)
    candidate = ((in_box | in_ctr) & valid).any(1, keepdim=True)  # (B, 1, A)
    pair = candidate & valid  # (B, M, A)
    exact = in_box & in_ctr  # unpenalised pairs

    iou = pairwise_iou(gt_boxes, pred_boxes)
    k = min(TOPK, A)
    # dynamic k: the sum of each gt's 10 best IoUs over the candidates (zeros pad a short list: same sum)
    dyn_k = torch.where(pair, iou, 0.0).topk(k, -1).values.sum(-1).floor().clamp(min=1)  # (B, M)
    # class cost + IOU_WEIGHT * -log(iou + eps), the same arithmetic in place: (B, M, A) tensors dominate the
    # assignment's memory when images hold many objects
    cost = class_cost(cls_logits, obj_logits, gt_cls).add_((iou + EPS_LOG).log_().neg_().mul_(IOU_WEIGHT))

    # each gt's k lowest costs, unpenalised pairs first: two top-k's, concatenated in rank order
    inf = torch.full((), float("inf"), device=cost.device)
    v0, i0 = torch.where(pair & exact, cost, inf).topk(k, -1, largest=False)
    v1, i1 = torch.where(pair & ~exact, cost, inf).topk(k, -1, largest=False)
    vals, idx = torch.cat((v0, v1), -1), torch.cat((i0, i1), -1)  # (B, M, 2k)
    finite = vals.isfinite()
    rank = finite.cumsum(-1) - 1
    take = finite & (rank < dyn_k.unsqueeze(-1))
    # an anchor claimed by several gts goes to the gt of lowest cost (over all of the image's gts, as YOLOX's
    # `cost[:, anchor_matching_gt > 1].min(0)`), unpenalised pairs first
    best_exact = torch.where(exact & valid, cost, inf).min(1)
    best_any = torch.where(valid, cost, inf).argmin(1)
    best = torch.where(best_exact.values.isfinite(), best_exact.indices, best_any)
    # add, not set: an infinite entry's index may repeat a taken one, and scatter_ with duplicates is undefined
    claims = torch.zeros_like(cost).scatter_add_(-1, idx, take.to(cost.dtype))  # (B, M, A), 0/1
    del cost  # the last (B, M, A) float read from it is above
    n_claims = claims.sum(1)  # (B, A)
    gt_index = torch.where(n_claims > 1, best, claims.argmax(1))  # (B, A)
    fg = n_claims > 0
    gt_index = torch.where(fg, gt_index, 0)

    # where, not a product: a padded gt's IoU may be NaN (two empty boxes)
    match_iou = torch.where(fg, iou.gather(1, gt_index.unsqueeze(1)).squeeze(1), 0.0)  # (B, A)
    matched_cls = gt_cls.long().gather(1, gt_index)  # (B, A)
    onehot = matched_cls.unsqueeze(-1) == torch.arange(C, device=matched_cls.device)  # no one_hot: it may sync
    target_cls = onehot * match_iou.unsqueeze(-1)
    target_boxes = gt_boxes.gather(1, gt_index.unsqueeze(-1).expand(-1, -1, 4))
    return Assignment(fg, gt_index, target_cls, target_boxes, match_iou)
