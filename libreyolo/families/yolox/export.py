"""What the exporters (libreyolo/export) need to know of YOLOX: its one raw output, and the decode that nms=true
puts in the graph before the NMS."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.base import ExportSpec, own
from libreyolo.families.yolox.loss import as_raw, decode
from libreyolo.families.yolox.network import YOLOX


def boxes_scores(net: nn.Module, raw: Any, imgsz: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The postprocess's decode: xyxy input pixels, and objectness times class probability."""
    raw = as_raw(raw).float()
    boxes, _, _ = decode(raw, imgsz, own(net, YOLOX).strides)
    return boxes, raw[..., 4:5].sigmoid() * raw[..., 5:].sigmoid()


EXPORT = ExportSpec(
    outputs=("raw",),
    meaning="raw (B, anchors, 5 + nc): per anchor (strides 8, 16, 32, row-major per level) x, y offsets and log "
    "width, height in strides, objectness logit, nc class logits; the family's postprocess decodes them and runs NMS",
    boxes_scores=boxes_scores,
)
