"""torchvision ResNet state dicts as RT-DETR's backbone (pretrained= only: the rest of the detector starts afresh).

RT-DETR's ResNet-vd has the same residual blocks as torchvision's ResNet-18/34/50/101 (`layer1..4` are its
`stages.0..3`), but a stem of three 3x3 convolutions instead of one 7x7 and shortcuts that average-pool before their
1x1 convolution. The blocks load (a shortcut's conv and BN one place further in its Sequential, behind the pool: a
start, since pooling before the 1x1 conv is not the strided 1x1 conv it was trained as); the stem is not read.
Official RT-DETR .pth files are not read yet (docs/weights.md)."""

from __future__ import annotations

import re
from typing import Any

import torch

from libreyolo.families.base import Converter, Foreign

PREFIX = "features.backbone.stages."
# (bottleneck blocks, blocks in layer3) -> the RT-DETR size of that depth
DEPTHS = {(False, 2): "r18", (False, 6): "r34", (True, 6): "r50", (True, 23): "r101"}
BLOCK = re.compile(r"layer([1-4])\.(\d+)\.(.+)")


def _ours(key: str) -> str | None:
    m = BLOCK.fullmatch(key)
    if m is None:
        return None  # the 7x7 stem and the classifier
    rest = m.group(3)
    if rest.startswith("downsample."):
        index, tail = rest[len("downsample.") :].split(".", 1)
        rest = f"downsample.{int(index) + 1}.{tail}"  # behind the shortcut's average pool
    return f"{PREFIX}{int(m.group(1)) - 1}.{m.group(2)}.{rest}"


def read(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    if "conv1.weight" not in tensors or "layer1.0.conv1.weight" not in tensors:
        return None
    blocks = len({k.split(".")[1] for k in tensors if k.startswith("layer3.")})
    size = DEPTHS.get(("layer1.0.conv3.weight" in tensors, blocks))
    if size is None:
        return None
    state = {ours: v for k, v in tensors.items() if (ours := _ours(k)) is not None}
    return Foreign(size, state, 0, partial=True)


CONVERTERS = (Converter("torchvision ResNet state dict as RT-DETR's backbone (pretrained= only)", read),)
