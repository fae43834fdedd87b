"""Packed detections: every family's postprocess returns one (N, 7) tensor per batch, batch index, x1, y1,
x2, y2, score, class, grouped by image in batch order with the best score first."""

from __future__ import annotations

import torch


def split_detections(packed: torch.Tensor, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """(N, 7) packed detections -> per image {boxes (n, 4), scores (n,), classes (n,) long}."""
    counts = torch.bincount(packed[:, 0].long(), minlength=batch_size).tolist() if len(packed) else [0] * batch_size
    return [{"boxes": p[:, 1:5], "scores": p[:, 5], "classes": p[:, 6].long()} for p in packed.split(counts)]
