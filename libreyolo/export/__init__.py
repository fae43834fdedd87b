"""Export a trained model to ONNX or TorchScript (`libreyolo export`, `LibreYOLO.export`) and read the exported file
back (`LibreYOLO("model.onnx")`) to predict and validate through onnxruntime or TorchScript with the family's own
post-processing. This package names no family: what a family's graph needs (its outputs, its decode for nms=true,
a fixed image size) comes from its ExportSpec (families/base.py). onnx and onnxruntime are imported only here, when
used (the optional extra `libreyolo[export]`)."""

from __future__ import annotations

from libreyolo.export.meta import SUFFIXES, ExportMeta

__all__ = ["SUFFIXES", "ExportMeta"]
