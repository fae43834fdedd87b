"""What the exporters (libreyolo/export) need to know of RT-DETR: two outputs, no NMS, one image size per graph."""

from __future__ import annotations

from libreyolo.families.base import ExportSpec

EXPORT = ExportSpec(
    outputs=("logits", "boxes"),
    meaning="logits (B, queries, nc) class logits per query; boxes (B, queries, 4) cx, cy, w, h normalised to the "
    "input; queries = min(300, encoder tokens); the postprocess keeps the best max_det (query, class) sigmoid scores",
    fixed_size="its decoder's query count (min(num_queries, encoder tokens)) and anchor grid are made for one image "
    "size when the graph is traced",
)
