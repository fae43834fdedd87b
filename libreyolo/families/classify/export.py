"""What the exporters (libreyolo/export) need to know of the classifiers: one output of class logits, no NMS."""

from __future__ import annotations

from libreyolo.families.base import ExportSpec

EXPORT = ExportSpec(
    outputs=("logits",),
    meaning="logits (B, nc) class logits of the centre crop; the postprocess takes the softmax's top k",
)
