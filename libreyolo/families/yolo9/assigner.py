"""Task-aligned assigner (TOOD), batched over images and padded ground truths.

Every tensor keeps a static shape (B, M, A) for M padded ground truths and A anchors: no Python loop
over images or boxes, no boolean indexing with data-dependent sizes and no host synchronisation, so
the same code runs eagerly and inside a captured CUDA graph."""

from __future__ import annotations

import math

import torch

from libreyolo.nn.boxes import pairwise_overlap


def pairwise_ciou(gt: torch.Tensor, pred: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """CIoU between each ground truth (B, M, 4) and each predicted box (B, A, 4) -> (B, M, A), clamped at 0; no
    gradient. The arithmetic of nn/boxes.ciou on gt[:, :, None] and pred[:, None], in the same order (bit for bit:
    tests/test_loss_parity.py), coordinate by coordinate and in place where a value is not read again, so that its
    temporaries are a few (B, M, A) tensors rather than (B, M, A, 2) pairs: at 150 objects per image (152 target
    slots), batch 16 with YOLOv9's auxiliary head, 640 px, each (B, M, A) float32 tensor is 163 MB."""
    ax1, ay1, ax2, ay2 = gt.unsqueeze(2).unbind(-1)  # (B, M, 1) each
    bx1, by1, bx2, by2 = pred.unsqueeze(1).unbind(-1)  # (B, 1, A) each
    inter, area_a, area_b = pairwise_overlap(gt, pred)
    union = area_a + area_b - inter + eps
    iou = inter.div_(union)
    del union
    c2 = (torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)).pow_(2)
    c2 += (torch.maximum(ay2, by2) - torch.minimum(ay1, by1)).pow_(2)
    c2 += eps  # the enclosing box's diagonal squared
    rho2 = (bx1 + bx2 - ax1 - ax2).pow_(2)
    rho2 += (by1 + by2 - ay1 - ay2).pow_(2)
    rho2 /= 4  # the centres' distance squared
    term = rho2.div_(c2)
    del c2
    w1, h1, w2, h2 = ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1
    v = (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))).pow_(2).mul_(4 / math.pi**2)
    alpha = v / (v - iou + (1 + eps))
    term += v.mul_(alpha)
    return iou.sub_(term).clamp_(min=0)


class TaskAlignedAssigner:
    def __init__(self, num_classes: int, topk: int = 10, alpha: float = 0.5, beta: float = 6.0, eps: float = 1e-9):
        self.num_classes, self.topk, self.alpha, self.beta, self.eps = num_classes, topk, alpha, beta, eps

    @torch.no_grad()
    def __call__(
        self,
        pd_scores: torch.Tensor,  # (B, A, C) probabilities
        pd_bboxes: torch.Tensor,  # (B, A, 4) xyxy, pixels
        anchors: torch.Tensor,  # (A, 2) pixels
        gt_labels: torch.Tensor,  # (B, M) long
        gt_bboxes: torch.Tensor,  # (B, M, 4) xyxy, pixels
        gt_mask: torch.Tensor,  # (B, M) bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> target boxes (B, A, 4), soft target scores (B, A, C), foreground mask (B, A). Values no longer read
        are overwritten in place: (B, M, A) tensors dominate the memory of the step's loss when images hold many
        objects."""
        B, A, C = pd_scores.shape
        M = gt_bboxes.shape[1]
        # anchors whose centre lies inside a (real) ground-truth box: all four distances to its sides above eps
        ax, ay = anchors.unbind(-1)  # (A,)
        x1, y1, x2, y2 = gt_bboxes.unsqueeze(-1).unbind(-2)  # (B, M, 1) each
        inside = gt_mask.unsqueeze(-1) & ((ax - x1) > self.eps)  # (B, M, A)
        inside &= (ay - y1) > self.eps
        inside &= (x2 - ax) > self.eps
        inside &= (y2 - ay) > self.eps

        # alignment metric s^alpha * iou^beta, where s is the predicted score of the gt's class (overlaps are already
        # zero outside the box, and so is their power)
        overlaps = pairwise_ciou(gt_bboxes, pd_bboxes).mul_(inside)
        align = pd_scores.transpose(1, 2).gather(1, gt_labels.unsqueeze(-1).expand(B, M, A)).pow_(self.alpha)
        align *= overlaps.pow(self.beta)

        # top-k anchors per ground truth, restricted to anchors inside it
        topk_idx = align.topk(min(self.topk, A), dim=-1).indices  # (B, M, k)
        pos = torch.zeros_like(align).scatter_(-1, topk_idx, 1.0).mul_(inside)  # (B, M, A) in {0, 1}
        del inside, topk_idx

        # an anchor claimed by several ground truths goes to the one it overlaps most (pos and best are 0 or 1, so
        # clearing the claimed columns and adding best's there is torch.where(multi, best, pos))
        multi = pos.sum(1, keepdim=True) > 1  # (B, 1, A)
        best = torch.zeros_like(pos).scatter_(1, overlaps.argmax(1, keepdim=True), 1.0)  # (B, M, A) one-hot over M
        pos.masked_fill_(multi, 0.0).add_(best.mul_(multi))
        del best

        fg = pos.sum(1) > 0  # (B, A)
        gt_idx = pos.argmax(1)  # (B, A)
        target_labels = gt_labels.gather(1, gt_idx)  # (B, A)
        target_bboxes = gt_bboxes.gather(1, gt_idx.unsqueeze(-1).expand(B, A, 4))

        # soft targets: alignment normalised per ground truth so its best anchor gets its best IoU
        align *= pos
        best_iou = overlaps.mul_(pos).amax(-1, keepdim=True)  # (B, M, 1)
        del pos, overlaps
        best_align = align.amax(-1, keepdim=True) + self.eps
        norm = align.mul_(best_iou).div_(best_align)
        score = (norm.amax(1) * fg).unsqueeze(-1)  # (B, A, 1)
        target_scores = torch.zeros_like(pd_scores).scatter_(
            -1, target_labels.unsqueeze(-1), score
        )  # one-hot times score
        return target_bboxes, target_scores, fg
