"""What the exporters (libreyolo/export) need to know of RTMDet: its one raw output, and the decode that nms=true
puts in the graph before the NMS."""

from __future__ import annotations

from libreyolo.families.base import ExportSpec
from libreyolo.families.rtmdet.postprocess import boxes_scores

EXPORT = ExportSpec(
    outputs=("raw",),
    meaning="raw (B, anchors, 4 + nc): per anchor (the cell corners of strides 8, 16, 32, row-major per level) the "
    "left, top, right, bottom distances to the box edges in input pixels, then nc class logits; the family's "
    "postprocess decodes them, clips the boxes to the input and runs NMS",
    boxes_scores=boxes_scores,
)
