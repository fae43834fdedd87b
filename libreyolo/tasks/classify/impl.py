"""Classification's implementation: datasets as class folders (data/folders.py), the random-resized-crop training
view and the centre-crop validation view (data/classify.py), top-1 / top-5 counted on the device (eval/topk.py), the
top-k classes from predict (predict_cls.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from libreyolo.config import TrainConfig
from libreyolo.data.classify import ClassifyDataset
from libreyolo.data.config import DataConfig
from libreyolo.data.folders import load_classify_config
from libreyolo.data.labels import LabelSet
from libreyolo.data.splits import scan_class_split
from libreyolo.eval.coco import EvalProcess
from libreyolo.eval.graphed import EvalGraph
from libreyolo.eval.topk import start_topk_validation
from libreyolo.eval.validator import PendingValidation, Stages, no_stages, to_input
from libreyolo.families.built import BuiltModel
from libreyolo.tasks.base import TaskImpl

if TYPE_CHECKING:
    from libreyolo.families import Family


def scan(data: DataConfig, split: str, notes: list[str], allow_empty: bool) -> LabelSet:
    return scan_class_split(data, split, notes)


def start_validation(
    net: nn.Module,
    family: Family,
    loader: Any,
    device: torch.device,
    names: list[str],
    loss_fn: Callable[..., Any] | None = None,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    autocast_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    static_shape: bool = False,
    eval_workers: int = 1,
    stages: Stages | None = None,
    background: bool = True,
    graph: EvalGraph | None = None,
    multi_label: bool = True,
    eval_process: EvalProcess | None = None,
) -> PendingValidation:
    """Top-1 / top-5 on the device, with the detection validator's signature: no boxes, nothing left to evaluate
    in the background (conf, iou, max_det, multi_label, eval_workers and eval_process do not apply)."""
    done = start_topk_validation(
        net,
        family,
        loader,
        device,
        loss_fn,
        autocast_dtype,
        lambda img: to_input(img, device, channels_last),
        getattr(loader, "batch_size", None) if static_shape else None,
        graph,
        stages or no_stages,
    )
    return PendingValidation(None, done, background=False)


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
    """The top-k classes and probabilities per image (`ClassResults`, or with stream an iterator of them), k = top_k."""
    from libreyolo.predict_cls import run_classify

    k = TrainConfig.parse_value("max_det", top_k)
    return run_classify(model, source, TrainConfig.parse_value("device", device), imgsz, k, stream=stream)


IMPL = TaskImpl(
    load_data=load_classify_config,
    scan=scan,
    dataset=ClassifyDataset,
    start_validation=start_validation,
    predict=predict,
)
