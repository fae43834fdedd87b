"""Object detection: boxes and classes, COCO's metrics (faster-coco-eval), YOLO-format datasets with mosaic. Its
implementation is impl.py, imported on first use."""

from __future__ import annotations

from libreyolo.tasks import Metric, Task, register

DETECT = register(
    Task(
        "detect",
        (
            Metric("precision", "P", "metrics/precision(B)"),
            Metric("recall", "R", "metrics/recall(B)"),
            Metric("map50", "mAP50", "metrics/mAP50(B)"),
            Metric("map", "mAP50-95", "metrics/mAP50-95(B)"),
        ),
        {"map50": 0.1, "map": 0.9},  # Ultralytics' fitness
        "map",
        impl="libreyolo.tasks.detect.impl",
        mosaic=True,
    )
)
