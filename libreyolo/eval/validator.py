"""Validation: loss on the validation set and COCO mAP of the (EMA) network."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from libreyolo.data.dataset import YOLODataset
from libreyolo.engine.step import normalize
from libreyolo.eval.coco import CocoAccumulator
from libreyolo.nn.nms import split_detections


def to_input(img: torch.Tensor, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """Host uint8 (B, H, W, 3) batch -> normalised float (B, 3, H, W) on the device."""
    return normalize(img.to(device, non_blocking=True), channels_last)


@torch.no_grad()
def validate(
    net: nn.Module,
    family: Any,
    loader: torch.utils.data.DataLoader,
    device: torch.device,
    names: list[str],
    loss_fn: Callable | None = None,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    autocast_dtype: torch.dtype | None = None,
    channels_last: bool = False,
) -> dict[str, Any]:
    """-> precision, recall, map50, map, losses {term: value} (the family's loss terms), images, time_s (all of it),
    eval_s (the COCO evaluation), bad (unreadable files)."""
    t0 = time.time()
    was_training = net.training
    net.eval()
    dataset: YOLODataset = loader.dataset
    acc = CocoAccumulator(names)
    loss_sum = torch.zeros(len(family.loss_terms), device=device)
    batches, bad = 0, []
    for batch in loader:
        bad.extend(batch["bad"])
        if batch["img"].shape[0] == 0:
            continue
        x = to_input(batch["img"], device, channels_last)
        imgsz = (x.shape[2], x.shape[3])
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            raw = net(x)
        if loss_fn is not None:
            _, items = loss_fn(raw, batch["targets"].to(device), batch["mask"].to(device), imgsz, 1.0)
            loss_sum += items
        dets = split_detections(family.postprocess(net, raw, imgsz, conf=conf, iou=iou, max_det=max_det, multi_label=True), x.shape[0])
        for k, d in enumerate(dets):
            i = int(batch["index"][k])
            s, (px, py) = float(batch["scale"][k]), batch["pad"][k].tolist()
            h0, w0 = dataset.labels.shapes[i]
            boxes = d["boxes"].float().cpu().numpy()
            boxes = (boxes - (px, py, px, py)) / s
            boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w0)
            boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h0)
            lab = dataset.labels.labels[i]
            gt = np.concatenate([lab[:, :1], _cxcywh_to_xyxy(lab[:, 1:]) * (w0, h0, w0, h0)], 1)
            acc.add(i, (h0, w0), gt, boxes, d["scores"].float().cpu().numpy(), d["classes"].cpu().numpy())
        batches += 1
    t_eval = time.time()
    metrics = acc.evaluate()
    losses = (loss_sum / max(batches, 1)).tolist()
    net.train(was_training)
    return {**metrics, "losses": dict(zip(family.loss_terms, losses)), "images": len(acc.images), "time_s": time.time() - t0,
            "eval_s": time.time() - t_eval, "bad": bad}


def _cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    return np.concatenate([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], 1)
