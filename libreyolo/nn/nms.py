"""Packed detections: every family's postprocess returns one (N, 7) tensor per batch, batch index, x1, y1,
x2, y2, score, class, grouped by image in batch order with the best score first."""

from __future__ import annotations

import torch
from torchvision.ops import batched_nms


@torch.no_grad()
def nms_packed(boxes: torch.Tensor, scores: torch.Tensor, conf: float, iou: float, max_det: int, multi_label: bool = False,
               max_nms: int = 30000) -> torch.Tensor:
    """boxes (B, A, 4) xyxy, scores (B, A, C) class probabilities -> packed (N, 7) detections.

    Per image: candidates are the (anchor, class) pairs scoring above conf (multi_label) or each anchor's best
    class above conf; at most max_nms of the highest; per-class NMS at iou; the best max_det kept."""
    out = []
    for b in range(boxes.shape[0]):
        bx, probs = boxes[b], scores[b]
        if multi_label:
            i, j = (probs > conf).nonzero(as_tuple=True)
            bx, sc, cl = bx[i], probs[i, j], j
        else:
            sc, cl = probs.max(1)
            keep = sc > conf
            bx, sc, cl = bx[keep], sc[keep], cl[keep]
        if sc.numel() > max_nms:
            top = sc.topk(max_nms).indices
            bx, sc, cl = bx[top], sc[top], cl[top]
        keep = batched_nms(bx, sc, cl, iou)[:max_det]
        n = keep.numel()
        out.append(torch.cat((torch.full((n, 1), float(b), device=bx.device), bx[keep], sc[keep, None], cl[keep, None].float()), 1))
    return torch.cat(out) if out else torch.zeros(0, 7, device=boxes.device)


def split_detections(packed: torch.Tensor, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """(N, 7) packed detections -> per image {boxes (n, 4), scores (n,), classes (n,) long}."""
    counts = torch.bincount(packed[:, 0].long(), minlength=batch_size).tolist() if len(packed) else [0] * batch_size
    return [{"boxes": p[:, 1:5], "scores": p[:, 5], "classes": p[:, 6].long()} for p in packed.split(counts)]
