"""YOLOv9 raw head output -> packed detections (decode, then the shared confidence filter and per-class NMS)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.base import own
from libreyolo.families.yolo9.network import YOLO9
from libreyolo.nn.nms import nms_packed


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
    """Raw logits (B, 4R + C, A) (or the train net's tuple, main head first) -> (N, 7): batch index, x1, y1, x2,
    y2 (input pixels), score, class."""
    if isinstance(raw, (tuple, list)):
        raw = raw[0]
    net = own(net, YOLO9)
    pred = net.head.decode(raw.float(), net.feature_shapes(*imgsz))  # (B, A, 4 + nc)
    return nms_packed(pred[..., :4], pred[..., 4:], conf, iou, max_det, multi_label)
