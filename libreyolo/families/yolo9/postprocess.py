"""YOLOv9 raw head output -> packed detections (decode, confidence filter, per-class NMS)."""

from __future__ import annotations

import torch
from torchvision.ops import batched_nms

from libreyolo.families.yolo9.network import YOLO9


@torch.no_grad()
def postprocess(net: YOLO9, raw: torch.Tensor, imgsz: tuple[int, int], conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
                multi_label: bool = False, max_nms: int = 30000) -> torch.Tensor:
    """Raw logits (B, 4R + C, A) -> (N, 7): batch index, x1, y1, x2, y2 (input pixels), score, class."""
    if isinstance(raw, (tuple, list)):
        raw = raw[0]
    pred = net.head.decode(raw.float(), net.feature_shapes(*imgsz))  # (B, A, 4 + nc)
    out = []
    for b, p in enumerate(pred):
        boxes, probs = p[:, :4], p[:, 4:]
        if multi_label:
            i, j = (probs > conf).nonzero(as_tuple=True)
            boxes, scores, classes = boxes[i], probs[i, j], j
        else:
            scores, classes = probs.max(1)
            keep = scores > conf
            boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
        if scores.numel() > max_nms:
            top = scores.topk(max_nms).indices
            boxes, scores, classes = boxes[top], scores[top], classes[top]
        keep = batched_nms(boxes, scores, classes, iou)[:max_det]
        n = keep.numel()
        out.append(torch.cat((torch.full((n, 1), float(b), device=p.device), boxes[keep], scores[keep, None], classes[keep, None].float()), 1))
    return torch.cat(out) if out else torch.zeros(0, 7, device=raw.device)
