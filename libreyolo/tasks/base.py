"""What a task's implementation provides (the torch side of a task; its description is tasks/__init__.py's Task):
how a dataset of the task is read, the dataset class whose training and validation views the loaders use, the
validation, and the predict output. A task's folder holds an implementation module whose IMPL is a TaskImpl."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libreyolo.data.config import DataConfig
    from libreyolo.data.labels import LabelSet
    from libreyolo.eval.validator import PendingValidation


@dataclass(frozen=True)
class TaskImpl:
    # data= as given (a yaml, a folder, "shapes") -> the dataset's description (libreyolo.data.config.DataConfig)
    load_data: Callable[[str], DataConfig]
    # (DataConfig, split, notes, allow_empty) -> the split scanned (a LabelSet); what was skipped becomes notes
    scan: Callable[[DataConfig, str, list[str], bool], LabelSet]
    # the dataset class: index with (index, epoch, mosaic) for a training view, an int for a validation view
    dataset: type
    # eval.validator.start_validation's signature -> a PendingValidation of the task's metrics
    start_validation: Callable[..., PendingValidation]
    # (model, source, conf, iou, imgsz, device, max_det, multi_label, top_k) -> per-image results; model.predict passes
    # stream=True only when asked for it: then an iterator of them, one image or video frame at a time
    predict: Callable[..., Any]
    # the validation's graph warms up beside the first training steps (its NMS and evaluation too)
    warm_validation: bool = False
