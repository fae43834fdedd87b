"""RT-DETR output -> packed detections without NMS: the queries are already one per object (the matching loss
taught them not to duplicate), so the best `max_det` (query, class) scores of each image are the detections."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.rtdetr.matcher import cxcywh_to_xyxy


@torch.no_grad()
def postprocess(
    net: nn.Module,
    raw: Any,
    imgsz: tuple[int, int],
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    multi_label: bool = False,
) -> torch.Tensor:
    """The detector's (logits (B, Q, C), boxes (B, Q, 4) normalised cx, cy, w, h) -> (N, 7): batch index, x1,
    y1, x2, y2 (input pixels), score, class; best first within each image. `iou` is unused (no NMS).
    multi_label: a query may give a detection per class; otherwise only its best class."""
    logits, boxes = raw
    B, Q, C = logits.shape
    prob = logits.float().sigmoid()
    if multi_label:
        scores, flat = prob.flatten(1).topk(min(max_det, Q * C), dim=1)
        query, cls = flat // C, flat % C
    else:
        best, best_cls = prob.max(-1)
        scores, query = best.topk(min(max_det, Q), dim=1)
        cls = best_cls.gather(1, query)
    h, w = imgsz
    xyxy = cxcywh_to_xyxy(boxes.float()) * boxes.new_tensor([w, h, w, h]).float()
    xyxy = xyxy.gather(1, query[..., None].expand(-1, -1, 4))
    batch = torch.arange(B, device=logits.device)[:, None].expand_as(scores)
    packed = torch.cat((batch[..., None].float(), xyxy, scores[..., None], cls[..., None].float()), -1)
    # topk sorts each image's rows, and rows stay grouped by image: the boolean filter keeps both orders
    return packed[scores > conf]
