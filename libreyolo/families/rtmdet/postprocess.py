"""RTMDet raw output -> packed detections: decode the distances around the cell corners, clip the boxes to the
input (as RTMDet's own postprocess), class probabilities as scores, then the shared confidence filter and
per-class NMS."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.base import own
from libreyolo.families.rtmdet.loss import anchor_points, as_raw, decode
from libreyolo.families.rtmdet.network import RTMDet
from libreyolo.nn.nms import nms_packed


def boxes_scores(net: nn.Module, raw: Any, imgsz: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> xyxy boxes in input pixels, clipped to the input, and the class probabilities."""
    raw = as_raw(raw).float()
    points, _ = anchor_points(imgsz, own(net, RTMDet).strides, raw.device, raw.dtype)
    boxes = decode(raw[..., :4], points)
    h, w = imgsz
    limit = boxes.new_tensor([w, h, w, h])
    return torch.minimum(boxes.clamp(min=0), limit), raw[..., 4:].sigmoid()


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
    """The detector's (B, A, 4 + nc) output -> (N, 7): batch index, x1, y1, x2, y2 (input pixels), score, class."""
    boxes, scores = boxes_scores(net, raw, imgsz)
    return nms_packed(boxes, scores, conf, iou, max_det, multi_label)
