"""`model.val(...)` / `libreyolo val`: validate a network on a dataset split outside training."""

from __future__ import annotations

from typing import Any

import torch

from libreyolo.amp import resolve_amp
from libreyolo.config import TrainConfig, resolve_multi_label, unknown_key_message
from libreyolo.data.loader import cpu_count, default_workers, val_loader
from libreyolo.distributed.device import parse_device
from libreyolo.errors import ConfigError, DataError
from libreyolo.eval.confusion import confusion_matrix
from libreyolo.families.built import BuiltModel
from libreyolo.nn.nms import check_nms
from libreyolo.tasks import get_task

VAL_KEYS = {"imgsz", "batch", "device", "workers", "conf", "iou", "max_det", "multi_label", "amp", "amp_dtype"}
SPLITS = ("train", "val", "test")


def run_val(model: BuiltModel, data: str | None = None, split: str = "val", **kwargs: Any) -> dict[str, Any]:
    """-> the task's metrics (detection: precision, recall, map50, map; classification: top1, top5), losses,
    images, time_s (forward, loss, NMS), eval_s (COCO evaluation), detections (detection), skipped (files that could
    not be used); detection also per_class (a row per class in the dataset's names order: class, images, instances,
    precision, recall, map50, map), curves (the PR, P, R and F1 curve data: eval/perclass.py) and confusion_matrix
    ((nc + 1, nc + 1) counts, rows true class, columns predicted, the last of each the background:
    eval/confusion.py)."""
    unknown = set(kwargs) - VAL_KEYS
    if unknown:
        raise ConfigError(unknown_key_message(sorted(unknown)[0], sorted(VAL_KEYS | {"data", "split"}), "val"))
    cfg = TrainConfig.from_overrides({"imgsz": model.imgsz, **kwargs}, family=model.family)
    kind, gpus = parse_device(cfg.device)
    device = torch.device(f"cuda:{gpus[0]}" if kind == "cuda" else kind)
    check_nms(device)  # a torchvision built for another torch: one error naming both, before any work
    task = get_task(model.family.task).implementation()
    dc = task.load_data(data or cfg.data)
    if dc.names != model.names and len(dc.names) != model.nc:
        raise DataError(
            f"{dc.yaml_path} has {len(dc.names)} classes but {model.model_name} was trained for {model.nc}: "
            f"{model.names}"
        )
    has = [k for k in SPLITS if getattr(dc, k)]
    if split not in has:
        raise DataError(
            f"split={split!r}: {dc.yaml_path} has no {split!r} split; its splits are {', '.join(has)}. "
            "Pass split= one of those (val is the default)"
        )
    ls = task.scan(dc, split, [], True)  # raises DataError naming the split when no image is usable
    batch = 16 if cfg.batch == -1 else cfg.batch
    workers = cfg.workers if cfg.workers is not None else default_workers(batch, len(gpus))
    dataset = task.dataset(ls, cfg.imgsz, augment=False)
    loader = val_loader(dataset, batch, workers, device.type == "cuda")
    net = model.net.to(device)
    amp = resolve_amp(cfg.amp, cfg.amp_dtype, device)
    # a large COCO evaluation (COCO val2017 holds up to 1.5 M detections) is split by categories over processes
    out = task.start_validation(
        net,
        model.family,
        loader,
        device,
        model.names,
        model.family.loss(net, cfg),
        cfg.conf,
        cfg.iou,
        cfg.max_det,
        amp.autocast_dtype,
        eval_workers=min(8, cpu_count()),
        multi_label=resolve_multi_label(cfg.multi_label, "val"),
        background=False,  # the COCO evaluation runs in this thread, when the result is asked for
    ).result()
    out["skipped"] = [f for f, _ in ls.skipped] + out.pop("bad")
    boxes = out.pop("boxes", None)  # what was evaluated: the confusion matrix is counted from it
    if boxes is not None:
        out["confusion_matrix"] = confusion_matrix(boxes["images"], boxes["gt"], boxes["dt"], len(model.names))
    return out
