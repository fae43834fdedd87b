"""Image classification: one class per image, top-1 and top-5 accuracy, datasets as class folders. Its implementation
is impl.py, imported on first use."""

from __future__ import annotations

from libreyolo.tasks import Metric, Task, register

# top-5 breaks ties between epochs of equal top-1 (small validation sets); the column names are Ultralytics'
CLASSIFY = register(
    Task(
        "classify",
        (Metric("top1", "top1", "metrics/accuracy_top1"), Metric("top5", "top5", "metrics/accuracy_top5")),
        {"top1": 0.9, "top5": 0.1},
        "top1",
        impl="libreyolo.tasks.classify.impl",
    )
)
