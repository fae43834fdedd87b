"""YOLOX raw output -> packed detections: decode, score = objectness * class probability, then the shared
confidence filter and per-class NMS."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.base import own
from libreyolo.families.yolox.loss import as_raw, decode
from libreyolo.families.yolox.network import YOLOX
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
    """The detector's (B, A, 5 + nc) output (or the train net's, the same) -> (N, 7): batch index, x1, y1, x2,
    y2 (input pixels), score, class."""
    raw = as_raw(raw).float()
    boxes, _, _ = decode(raw, imgsz, own(net, YOLOX).strides)
    scores = raw[..., 4:5].sigmoid() * raw[..., 5:].sigmoid()
    return nms_packed(boxes, scores, conf, iou, max_det, multi_label)
