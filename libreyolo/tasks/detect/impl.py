"""Detection's implementation: YOLO-format datasets (data/config.py, data/labels.py), the mosaic/affine training view
and the letterboxed validation view (data/dataset.py), the COCO validation (eval/validator.py), boxes from predict
(predict.py)."""

from __future__ import annotations

from typing import Any

from libreyolo.config import TrainConfig, resolve_multi_label
from libreyolo.data.config import DataConfig, load_data_config
from libreyolo.data.dataset import YOLODataset
from libreyolo.data.labels import LabelSet
from libreyolo.data.splits import scan_split
from libreyolo.eval.validator import start_validation
from libreyolo.families.built import BuiltModel
from libreyolo.tasks.base import TaskImpl


def scan(data: DataConfig, split: str, notes: list[str], allow_empty: bool) -> LabelSet:
    return scan_split(data, split, data.nc, notes, allow_empty)


def predict(
    model: BuiltModel,
    source: Any,
    conf: float,
    iou: float,
    imgsz: int,
    device: str,
    max_det: int,
    multi_label: bool | str,
    top_k: int,
    stream: bool = False,
) -> Any:
    """Boxes per image (`Predictions` of `Results`, or with stream an iterator of them); multi_label auto is false
    here (one class per box)."""
    from libreyolo.predict import run_predict

    kw: dict[str, Any] = {"conf": conf, "iou": iou, "imgsz": imgsz, "device": device, "max_det": max_det}
    kw = {k: TrainConfig.parse_value(k, v) for k, v in {**kw, "multi_label": multi_label}.items()}
    kw["multi_label"] = resolve_multi_label(kw["multi_label"], "predict")
    return run_predict(model, source, **kw, stream=stream)


IMPL = TaskImpl(
    load_data=load_data_config,
    scan=scan,
    dataset=YOLODataset,
    start_validation=start_validation,
    predict=predict,
    warm_validation=True,
)
