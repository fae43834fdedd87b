"""What the exporters (libreyolo/export) need to know of D-FINE: RT-DETR's two outputs, no NMS, one image size per
graph."""

from __future__ import annotations

from libreyolo.families.rtdetr.export import EXPORT

__all__ = ["EXPORT"]
