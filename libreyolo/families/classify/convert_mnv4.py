"""LibreYOLO 1.6's MobileNetV4-Conv-M and -L checkpoints (timm's layout: conv_stem, blocks.i.j, conv_head,
classifier) as this family's `LibreMNv4m` / `LibreMNv4l`: the same layers in the same order, so the tensors map one
to one by position once every shape agrees. 1.6's S starts with plain conv-BN-ReLU pairs where this project's S has
fused inverted bottlenecks (no ReLU after their 1x1 projection): the same shapes, another function, refused.
1.6 normalises the input by ImageNet's mean and standard deviation, this project does not (see convert.py)."""

from __future__ import annotations

from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign

STEM_WIDTH = {32: "m", 24: "l"}  # S's stem is 32 wide too, told apart by its first block


def read(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    if "conv_stem.weight" not in tensors or "classifier.weight" not in tensors:
        return None
    if not any(".pw_exp." in k for k in tensors):  # timm's other conv nets (MobileNetV3, EfficientNet) lack UIBs
        return None
    if "blocks.0.0.conv_exp.weight" not in tensors:  # S: plain convolutions first
        raise CheckpointError(
            "LibreYOLO 1.6's MobileNetV4-Conv-S starts with plain conv-BN-ReLU layers where this project's LibreMNv4s "
            "has fused inverted bottlenecks: the same shapes, another network; 1.6's M and L load"
        )
    size = STEM_WIDTH.get(tensors["conv_stem.weight"].shape[0])
    if size is None:
        return None
    from libreyolo.families.classify.mnv4 import MobileNetV4

    nc = int(tensors["classifier.weight"].shape[0])
    ours = MobileNetV4(nc, size).state_dict()
    theirs = [(k, v) for k, v in tensors.items() if not k.endswith("num_batches_tracked")]
    mine = [k for k in ours if not k.endswith("num_batches_tracked")]
    if len(theirs) != len(mine) or any(ours[k].shape != v.shape for k, (_, v) in zip(mine, theirs)):
        raise CheckpointError(
            f"a MobileNetV4 checkpoint whose layers are not LibreMNv4{size}'s ({len(theirs)} tensors)"
        )
    state = {k: v for k, (_, v) in zip(mine, theirs)}
    return Foreign.with_meta(size, state, nc, meta)


CONVERTERS = (Converter("LibreYOLO 1.6 MobileNetV4-Conv checkpoint (timm's layout; M and L)", read),)
