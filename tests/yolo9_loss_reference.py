"""A frozen copy of the YOLOv9 loss as it was before its op count was reduced (libreyolo 2026-12-01: nn/boxes.py,
families/yolo9/assigner.py and loss.py, nn/head.py's box helpers), kept only as the reference that
tests/test_loss_parity.py compares the live implementation with. Not imported by libreyolo."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def ciou(box1, box2, eps=1e-7):
    b1x1, b1y1, b1x2, b1y2 = box1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = box2.unbind(-1)
    w1, h1 = b1x2 - b1x1, b1y2 - b1y1
    w2, h2 = b2x2 - b2x1, b2y2 - b2y1
    inter = (torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp(min=0) * (
        torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)
    ).clamp(min=0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)
    ch = torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)
    c2 = cw.pow(2) + ch.pow(2) + eps
    rho2 = ((b2x1 + b2x2 - b1x1 - b1x2).pow(2) + (b2y1 + b2y2 - b1y1 - b1y2).pow(2)) / 4
    v = (4 / math.pi**2) * (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def make_anchors(shapes, strides, device, dtype):
    points, stride_t = [], []
    for (h, w), s in zip(shapes, strides):
        sy, sx = torch.meshgrid(
            torch.arange(h, device=device, dtype=dtype) + 0.5,
            torch.arange(w, device=device, dtype=dtype) + 0.5,
            indexing="ij",
        )
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_t.append(torch.full((h * w, 1), s, dtype=dtype, device=device))
    return torch.cat(points), torch.cat(stride_t)


def dfl_decode(distri, reg_max):
    p = distri.unflatten(-1, (4, reg_max)).softmax(-1)
    return p @ torch.arange(reg_max, device=distri.device, dtype=distri.dtype)


def dist2bbox(dist, anchors):
    lt, rb = dist.chunk(2, -1)
    return torch.cat((anchors - lt, anchors + rb), -1)


def bbox2dist(anchors, boxes, reg_max):
    x1y1, x2y2 = boxes.chunk(2, -1)
    return torch.cat((anchors - x1y1, x2y2 - anchors), -1).clamp_(0, reg_max - 1.01)


@torch.no_grad()
def assign(pd_scores, pd_bboxes, anchors, gt_labels, gt_bboxes, gt_mask, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
    B, A, C = pd_scores.shape
    M = gt_bboxes.shape[1]
    x1y1, x2y2 = gt_bboxes.unsqueeze(2).chunk(2, -1)
    deltas = torch.cat((anchors - x1y1, x2y2 - anchors), -1)
    inside = (deltas.amin(-1) > eps) & gt_mask.unsqueeze(-1)
    cls_scores = pd_scores.transpose(1, 2).gather(1, gt_labels.unsqueeze(-1).expand(B, M, A))
    overlaps = ciou(gt_bboxes.unsqueeze(2), pd_bboxes.unsqueeze(1)).clamp_(min=0) * inside
    align = cls_scores.pow(alpha) * overlaps.pow(beta) * inside
    topk_idx = align.topk(min(topk, A), dim=-1).indices
    candidates = torch.zeros_like(align).scatter_(-1, topk_idx, 1.0)
    pos = candidates * inside
    multi = pos.sum(1, keepdim=True) > 1
    gt_range = torch.arange(M, device=pos.device).view(1, M, 1)
    best = (overlaps.argmax(1, keepdim=True) == gt_range).to(pos.dtype)
    pos = torch.where(multi, best, pos)
    fg = pos.sum(1) > 0
    gt_idx = pos.argmax(1)
    target_labels = gt_labels.gather(1, gt_idx)
    target_bboxes = gt_bboxes.gather(1, gt_idx.unsqueeze(-1).expand(B, A, 4))
    align = align * pos
    norm = align * (overlaps * pos).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + eps)
    one_hot = target_labels.unsqueeze(-1) == torch.arange(C, device=pos.device)
    target_scores = one_hot.to(pd_scores.dtype) * (norm.amax(1) * fg).unsqueeze(-1)
    return target_bboxes, target_scores, fg


def dfl(distri, target, reg_max):
    logp = distri.unflatten(-1, (4, reg_max)).log_softmax(-1)
    left = target.long().clamp_(0, reg_max - 2)
    w_left = (left + 1).to(target.dtype) - target
    lp = logp.gather(-1, left.unsqueeze(-1)).squeeze(-1)
    rp = logp.gather(-1, (left + 1).unsqueeze(-1)).squeeze(-1)
    return -(lp * w_left + rp * (1.0 - w_left)).mean(-1)


def detection_loss(
    raw,
    targets,
    mask,
    imgsz,
    batch_scale,
    head_weights=(1.0,),
    nc=80,
    strides=(8, 16, 32),
    reg_max=16,
    gains=(7.5, 0.5, 1.5),
):
    """DetectionLoss.__call__ with the default assigner settings and no DDP normaliser reducer."""
    raw = raw.float()
    H = len(head_weights)
    if H > 1:
        targets, mask = targets.repeat(H, 1, 1), mask.repeat(H, 1)
    shapes = [(imgsz[0] // s, imgsz[1] // s) for s in strides]
    anchors, stride = make_anchors(shapes, list(strides), raw.device, raw.dtype)
    anchors_px = anchors * stride
    distri, logits = raw.transpose(1, 2).split((4 * reg_max, nc), -1)
    pred_boxes = dist2bbox(dfl_decode(distri, reg_max), anchors)
    t_boxes, t_scores, fg = assign(
        logits.detach().sigmoid(),
        pred_boxes.detach() * stride,
        anchors_px,
        targets[..., 0].long(),
        targets[..., 1:5],
        mask,
    )
    normalizer = t_scores.unflatten(0, (H, -1)).sum((1, 2, 3)).clamp(min=1.0)
    cls_sum = (
        F.binary_cross_entropy_with_logits(logits, t_scores, reduction="none").unflatten(0, (H, -1)).sum((1, 2, 3))
    )
    weight = t_scores.sum(-1) * fg
    t_boxes = torch.where(fg.unsqueeze(-1), t_boxes / stride, pred_boxes.detach())
    t_dist = bbox2dist(anchors, t_boxes, reg_max)
    per_anchor = torch.stack(((1.0 - ciou(pred_boxes, t_boxes)), dfl(distri, t_dist, reg_max)), -1) * weight.unsqueeze(
        -1
    )
    box_dfl = per_anchor.unflatten(0, (H, -1)).sum((1, 2))
    items = torch.stack((box_dfl[:, 0], cls_sum, box_dfl[:, 1]), 1) / normalizer.unsqueeze(1)
    g_box, g_cls, g_dfl = gains
    per_head = items[:, 0] * g_box + items[:, 1] * g_cls + items[:, 2] * g_dfl
    total = per_head[0] * head_weights[0]
    for h in range(1, H):
        total = total + per_head[h] * head_weights[h]
    return total * batch_scale, items[0].detach()
