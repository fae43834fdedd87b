"""YOLOv9 checkpoints of LibreYOLO 1.6 (.pt and .safetensors): read into this family's layout, and written back.

1.6 names its modules backbone.conv0 ... neck.elan_down2 and head.cv2 (box towers) / head.cv3 (class towers); the
blocks inside them are named as here, so the conversion renames prefixes. Both take RGB in 0..1. 1.6's m and c are
this family's m and c. Its t and s are the published YOLOv9-T/S (AConv downsamplers, grouped box towers), which
this family's t and s are not (ADown, ungrouped: tests/test_sizes.py): those files are refused with that reason.
The PGI auxiliary branch (aux., aux_head.) is a training-only part and is not read."""

from __future__ import annotations

from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign
from libreyolo.families.yolo9.network import SIZES

PREFIXES = (  # 1.6's -> ours
    ("backbone.conv0.", "stem.0."),
    ("backbone.conv1.", "stem.1."),
    ("backbone.elan1.", "stem.2."),
    ("backbone.down2.", "b3.0."),
    ("backbone.elan2.", "b3.1."),
    ("backbone.down3.", "b4.0."),
    ("backbone.elan3.", "b4.1."),
    ("backbone.down4.", "b5.0."),
    ("backbone.elan4.", "b5.1."),
    ("backbone.spp.", "b5.2."),
    ("neck.elan_up1.", "td4."),
    ("neck.elan_up2.", "td3."),
    ("neck.down1.", "down4."),
    ("neck.elan_down1.", "bu4."),
    ("neck.down2.", "down5."),
    ("neck.elan_down2.", "bu5."),
    ("head.cv2.", "head.box."),
    ("head.cv3.", "head.cls."),
)
SKIPPED = ("aux.", "aux_head.")  # 1.6's PGI branch, built only while it trains


def _rename(key: str, pairs: tuple[tuple[str, str], ...]) -> str | None:
    for theirs, ours in pairs:
        if key.startswith(theirs):
            return ours + key[len(theirs) :]
    return None


def _size(tensors: dict[str, torch.Tensor]) -> str:
    """1.6's size from its shapes: the first conv's width, and whether the stride-4 block is a GELAN block."""
    width = tensors["backbone.conv0.conv.weight"].shape[0]
    gelan = "backbone.elan1.cv2.0.cv1.conv.weight" in tensors
    size = {(16, False): "t", (32, False): "s", (32, True): "m", (64, True): "c"}.get((width, gelan))
    if size is None:
        raise CheckpointError(f"a LibreYOLO 1.6 YOLOv9 whose first conv has {width} channels is no known size")
    return size


def read(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    if "backbone.conv0.conv.weight" not in tensors or "head.cv3.0.2.weight" not in tensors:
        return None
    size = _size(tensors)
    if SIZES[size].box_groups == 1:
        raise CheckpointError(
            f"LibreYOLO 1.6's YOLOv9-{size} is the published layout (AConv downsamplers, grouped box towers), which "
            f"this project's LibreYOLO9{size} is not (ADown, ungrouped); 1.6's m and c load, and its t and s cannot "
            "yet (issue 49)"
        )
    state = {}
    for key, value in tensors.items():
        if key.startswith(SKIPPED) or key.endswith("num_batches_tracked"):
            continue
        ours = _rename(key, PREFIXES)
        if ours is None:
            raise CheckpointError(f"LibreYOLO 1.6 YOLOv9 weight {key!r} has no place in LibreYOLO9{size}")
        state[ours] = value
    nc = int(tensors["head.cv3.0.2.weight"].shape[0])
    return Foreign.with_meta(size, state, nc, meta)


def write(state: dict[str, torch.Tensor], size: str) -> dict[str, torch.Tensor]:
    back = tuple((ours, theirs) for theirs, ours in PREFIXES)
    out = {}
    for key, value in state.items():
        theirs = _rename(key, back)
        if theirs is None:
            raise CheckpointError(f"LibreYOLO9{size} weight {key!r} has no place in LibreYOLO 1.6's layout")
        out[theirs] = value
    return out


CONVERTERS = (Converter("LibreYOLO 1.6 YOLOv9 checkpoint", read, write),)
