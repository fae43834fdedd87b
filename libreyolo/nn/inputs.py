"""A batch as the network takes it: the loaders hand uint8 images, the device turns them into floats."""

from __future__ import annotations

import torch


def normalize(img: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W) in [0, 1], on the device: the host only ever moves bytes."""
    x = img.permute(0, 3, 1, 2).float().div_(255.0)
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
