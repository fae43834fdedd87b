"""YOLOX checkpoints of the official release (Megvii-BaseDetection/YOLOX, yolox_*.pth) and of LibreYOLO 1.6 (.pt
and .safetensors), which keeps the official layout: read into this family's layout, and written back.

The official network is one `backbone` (YOLOPAFPN) holding the CSPDarknet as `backbone.backbone` and the PAFPN's
layers beside it; here they are `backbone` and `neck`. Module names below those, and the head's, are the same.
The official network takes BGR pixels in 0..255, this one RGB in 0..1: the stem's convolution (Focus: four 2x2
phases of three channels each) has its input channels reversed within each phase and multiplied by 255, which
computes exactly the same function of the same image."""

from __future__ import annotations

from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign
from libreyolo.families.yolox.network import SIZES

STEM = "backbone.stem.conv.conv.weight"  # ours; theirs: "backbone." + this
NECK = ("lateral_conv0.", "C3_p4.", "reduce_conv1.", "C3_p3.", "bu_conv2.", "C3_n3.", "bu_conv1.", "C3_n4.")
WIDTHS = {int(s.width * 64): name for name, s in SIZES.items()}  # the stem's width -> size


def _ours(key: str) -> str | None:
    if key.startswith("backbone.backbone."):
        return key[len("backbone.") :]
    if key.startswith("backbone.") and key[len("backbone.") :].startswith(NECK):
        return "neck." + key[len("backbone.") :]
    return key if key.startswith("head.") else None


def _theirs(key: str) -> str:
    if key.startswith("neck."):
        return "backbone." + key[len("neck.") :]
    return "backbone." + key if key.startswith("backbone.") else key


def _phases_reversed(w: torch.Tensor) -> torch.Tensor:
    """Reverse the channel order (BGR <-> RGB) within each of the stem's four 3-channel phases."""
    return w.unflatten(1, (4, 3)).flip(2).flatten(1, 2)


def _convert(tensors: dict[str, torch.Tensor]) -> Foreign | None:
    stem = tensors.get("backbone." + STEM)
    if stem is None or "head.cls_preds.0.weight" not in tensors:
        return None
    size = WIDTHS.get(stem.shape[0])
    if size is None:
        raise CheckpointError(f"a YOLOX stem of width {stem.shape[0]} is no YOLOX size ({', '.join(SIZES)})")
    state = {}
    for key, value in tensors.items():
        ours = _ours(key)
        if ours is not None and not key.endswith("num_batches_tracked"):
            state[ours] = value
    state[STEM] = _phases_reversed(state[STEM].float() * 255.0).to(stem.dtype)
    return Foreign(size, state, int(tensors["head.cls_preds.0.weight"].shape[0]))


def write(state: dict[str, torch.Tensor], size: str) -> dict[str, torch.Tensor]:
    out = {_theirs(k): v for k, v in state.items()}
    stem = state[STEM]
    out["backbone." + STEM] = (_phases_reversed(stem.float()) / 255.0).to(stem.dtype)
    return out


def _libreyolo16(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    """LibreYOLO 1.6 stamps its checkpoints (.pt: schema_version, model_family "yolox"); its .safetensors hold the
    weights alone, which the official reader below takes."""
    if "schema_version" not in meta or meta.get("model_family") != "yolox":
        return None
    got = _convert(tensors)
    if got is None:
        return None
    return Foreign.with_meta(got.size, got.state, got.nc, meta)


def _official(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    return _convert(tensors)


CONVERTERS = (
    Converter("LibreYOLO 1.6 YOLOX checkpoint", _libreyolo16, write),
    Converter(
        "YOLOX weights in the official layout (Megvii yolox_*.pth, LibreYOLO 1.6 .safetensors)", _official, write
    ),
)
