"""`model.predict(...)` / `libreyolo predict`: letterbox, forward, decode + NMS, boxes in original pixels."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo.data.augment import letterbox
from libreyolo.data.config import IMG_EXTS
from libreyolo.data.dataset import read_image
from libreyolo.distributed.device import parse_device
from libreyolo.errors import DataError
from libreyolo.eval.validator import to_input, to_original
from libreyolo.nn.nms import split_detections


@dataclass
class Results:
    """Detections for one image: boxes (n, 4) xyxy in original pixels, scores (n,), classes (n,)."""

    boxes: torch.Tensor
    scores: torch.Tensor
    classes: torch.Tensor
    names: list[str]
    orig_shape: tuple[int, int]
    path: str | None = None
    image: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.scores)

    def to_list(self) -> list[dict[str, Any]]:
        return [
            {"class": int(c), "name": self.names[int(c)], "score": float(s), "box": [float(v) for v in b]}
            for b, s, c in zip(self.boxes.tolist(), self.scores.tolist(), self.classes.tolist())
        ]


def _sources(source: Any) -> list[tuple[str | None, np.ndarray | None]]:
    """Paths, folders, lists, numpy arrays (BGR, as OpenCV gives them) or PIL images -> (path, RGB array or None)."""
    if isinstance(source, (list, tuple)):
        return [x for s in source for x in _sources(s)]
    if isinstance(source, np.ndarray):
        return [(None, np.ascontiguousarray(source[..., ::-1]))]
    if hasattr(source, "convert") and hasattr(source, "size"):  # PIL image
        return [(None, np.asarray(source.convert("RGB")))]
    p = Path(os.fspath(source))
    if p.is_dir():
        return [(str(f), None) for f in sorted(p.iterdir()) if f.suffix.lower() in IMG_EXTS]
    if not p.is_file():
        raise DataError(f"source {p} does not exist (pass an image, a folder of images, or a list)")
    return [(str(p), None)]


@torch.no_grad()
def run_predict(
    model: Any,
    source: Any,
    conf: float = 0.25,
    iou: float = 0.7,
    imgsz: int = 640,
    device: str = "auto",
    max_det: int = 300,
    batch: int = 8,
) -> list[Results]:
    kind, gpus = parse_device(device)
    dev = torch.device(f"cuda:{gpus[0]}" if kind == "cuda" else kind)
    net = model.net.to(dev).eval()
    items = _sources(source)
    results: list[Results] = []
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        imgs, metas = [], []
        for path, arr in chunk:
            img = arr if arr is not None else read_image(path)
            if img is None:
                raise DataError(f"{path}: the image cannot be decoded")
            lb, r, pad = letterbox(img, imgsz)
            imgs.append(lb)
            metas.append((path, img, r, pad))
        x = to_input(torch.from_numpy(np.stack(imgs)), dev)
        packed = model.family.postprocess(net, net(x), (imgsz, imgsz), conf=conf, iou=iou, max_det=max_det)
        # boxes back to original pixels on the device, then one copy of the batch's detections to the host
        lb = torch.tensor(
            [[r, px, py, img.shape[0], img.shape[1]] for _, img, r, (px, py) in metas], dtype=torch.float32, device=dev
        )
        packed = to_original(packed, lb[:, 0], lb[:, 1:3], lb[:, 3:5]).cpu()
        for d, (path, img, _, _) in zip(split_detections(packed, x.shape[0]), metas):
            results.append(Results(d["boxes"], d["scores"], d["classes"], model.names, img.shape[:2], path, img))
    return results
