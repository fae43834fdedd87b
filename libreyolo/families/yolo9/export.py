"""What the exporters (libreyolo/export) need to know of YOLOv9: its one raw output, and the decode that nms=true
puts in the graph before the NMS."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.base import ExportSpec, own
from libreyolo.families.yolo9.network import YOLO9


def boxes_scores(net: nn.Module, raw: Any, imgsz: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The postprocess's decode: DFL distances around the anchor points -> xyxy input pixels, class sigmoids."""
    yolo = own(net, YOLO9)
    pred = yolo.head.decode(raw.float(), yolo.feature_shapes(*imgsz))
    return pred[..., :4], pred[..., 4:]


EXPORT = ExportSpec(
    outputs=("raw",),
    meaning="raw (B, 4*16 + nc, anchors): per anchor (strides 8, 16, 32, row-major per level), 4 x 16 DFL box "
    "logits (left, top, right, bottom) then nc class logits; the family's postprocess decodes them and runs NMS",
    boxes_scores=boxes_scores,
)
