"""Task-aligned assigner (TOOD), batched over images and padded ground truths.

Every tensor keeps a static shape (B, M, A) for M padded ground truths and A anchors: no Python loop
over images or boxes, no boolean indexing with data-dependent sizes and no host synchronisation, so
the same code runs eagerly and inside a captured CUDA graph."""

from __future__ import annotations

import torch

from libreyolo.nn.boxes import ciou


def pairwise_ciou(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """CIoU between each ground truth (B, M, 4) and each predicted box (B, A, 4) -> (B, M, A), clamped at 0."""
    return ciou(gt.unsqueeze(2), pred.unsqueeze(1)).clamp_(min=0)


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
        """-> target boxes (B, A, 4), soft target scores (B, A, C), foreground mask (B, A)."""
        B, A, C = pd_scores.shape
        M = gt_bboxes.shape[1]
        # anchors whose centre lies inside a (real) ground-truth box
        x1y1, x2y2 = gt_bboxes.unsqueeze(2).chunk(2, -1)  # (B, M, 1, 2)
        deltas = torch.cat((anchors - x1y1, x2y2 - anchors), -1)  # (B, M, A, 4)
        inside = (deltas.amin(-1) > self.eps) & gt_mask.unsqueeze(-1)  # (B, M, A)

        # alignment metric s^alpha * iou^beta, where s is the predicted score of the gt's class (overlaps are already
        # zero outside the box, and so is their power)
        cls_scores = pd_scores.transpose(1, 2).gather(1, gt_labels.unsqueeze(-1).expand(B, M, A))
        overlaps = pairwise_ciou(gt_bboxes, pd_bboxes) * inside
        align = cls_scores.pow(self.alpha) * overlaps.pow(self.beta)

        # top-k anchors per ground truth, restricted to anchors inside it
        topk_idx = align.topk(min(self.topk, A), dim=-1).indices  # (B, M, k)
        candidates = torch.zeros_like(align).scatter_(-1, topk_idx, 1.0)
        pos = candidates * inside  # (B, M, A) in {0, 1}

        # an anchor claimed by several ground truths goes to the one it overlaps most
        multi = pos.sum(1, keepdim=True) > 1  # (B, 1, A)
        best = torch.zeros_like(pos).scatter_(1, overlaps.argmax(1, keepdim=True), 1.0)  # (B, M, A) one-hot over M
        pos = torch.where(multi, best, pos)

        fg = pos.sum(1) > 0  # (B, A)
        gt_idx = pos.argmax(1)  # (B, A)
        target_labels = gt_labels.gather(1, gt_idx)  # (B, A)
        target_bboxes = gt_bboxes.gather(1, gt_idx.unsqueeze(-1).expand(B, A, 4))

        # soft targets: alignment normalised per ground truth so its best anchor gets its best IoU
        align = align * pos
        norm = align * (overlaps * pos).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + self.eps)
        score = (norm.amax(1) * fg).unsqueeze(-1)  # (B, A, 1)
        target_scores = torch.zeros_like(pd_scores).scatter_(
            -1, target_labels.unsqueeze(-1), score
        )  # one-hot times score
        return target_bboxes, target_scores, fg
