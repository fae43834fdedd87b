"""`model.predict(...)` for a classifier: the validation view (short-side resize + centre crop), forward, and the
top-k classes with their probabilities, one device-to-host copy per batch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from libreyolo.data.augment import center_crop
from libreyolo.distributed.device import first_device
from libreyolo.eval.validator import to_input
from libreyolo.families.built import BuiltModel
from libreyolo.predict import Predictions, PredictStream, read_batches, run_or_stream


@dataclass
class ClassResults:
    """The top-k classes of one image, best first, with their softmax probabilities."""

    classes: torch.Tensor  # (k,) int64
    scores: torch.Tensor  # (k,) float32
    names: list[str]
    orig_shape: tuple[int, int]
    path: str | None = None
    image: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def top1(self) -> str:
        return self.names[int(self.classes[0])]

    def to_list(self) -> list[dict[str, Any]]:
        return [
            {"class": int(c), "name": self.names[int(c)], "score": float(s)}
            for c, s in zip(self.classes.tolist(), self.scores.tolist(), strict=True)
        ]


def run_classify(
    model: BuiltModel, source: Any, device: str, imgsz: int, top_k: int = 5, batch: int = 32, stream: bool = False
) -> Predictions | PredictStream:
    """-> a `ClassResults` per readable image (stream: an iterator of them). An unreadable image is skipped (a
    warning names it, `Predictions.skipped` lists it); none readable is an error."""
    results = Predictions()
    return run_or_stream(_classify(model, source, device, imgsz, top_k, batch, results), results, stream)


@torch.no_grad()
def _classify(
    model: BuiltModel, source: Any, device: str, imgsz: int, top_k: int, batch: int, results: Predictions
) -> Iterator[ClassResults]:
    dev = first_device(device)
    net = model.net.to(dev).eval()
    for batch_items in read_batches(source, batch, results):
        views = [center_crop(img, imgsz) for _, img in batch_items]
        x = to_input(torch.from_numpy(np.stack(views)), dev)
        out = model.family.postprocess(net, net(x), (imgsz, imgsz), max_det=top_k).cpu()  # (B, k, 2)
        for (path, img), row in zip(batch_items, out, strict=True):
            yield ClassResults(row[:, 0].long(), row[:, 1], model.names, img.shape[:2], path, img)
