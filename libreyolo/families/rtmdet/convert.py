"""RTMDet weights of LibreYOLO 1.6 (.pt and .safetensors) and of mmdetection's layout (the official release's
state_dict, its head named `bbox_head`): read into this family's layout, and written back.

Backbone and neck keep mmdetection's module names here. The head differs: mmdetection (and 1.6) build a conv module
per level whose convolution is the level-0 one (the same tensor under three names, each level with its own
BatchNorm); here the shared convolutions are held once (`head.cls_convs.{layer}`) and the norms beside them
(`head.cls_norms.{level}.{layer}`). Files name the shared weight once per level: level 0's is read, and a file whose
levels hold different weights is no RTMDet of this layout (refused).

The official network takes BGR pixels normalised by mmdetection's BGR mean and std, this one RGB normalised by the
same values in RGB order: the stem's first convolution has its input channels reversed, which computes exactly the
same function of the same image (zero padding included: it pads the normalised input in both)."""

from __future__ import annotations

import re
from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign

STEM = "backbone.stem.0.conv.weight"
CLS = "rtm_cls.0.weight"
WIDTHS = {12: "t", 16: "s", 24: "m", 32: "l", 40: "x"}  # the stem's first width -> size
TOWER = re.compile(r"^(cls|reg)_convs\.(\d+)\.(\d+)\.(conv|bn)\.(.+)$")
SKIP = re.compile(r"num_batches_tracked$|^data_preprocessor\.")


def _convert(tensors: dict[str, torch.Tensor], prefix: str) -> Foreign | None:
    """prefix: where the file keeps the head ("head." in LibreYOLO 1.6's layout, "bbox_head." in mmdetection's)."""
    if prefix + CLS not in tensors or STEM not in tensors:
        return None
    if any(".rtm_kernel." in k or ".mask_head." in k for k in tensors):
        raise CheckpointError("an RTMDet-Ins checkpoint (instance masks): only RTMDet detection is built here")
    stem = tensors[STEM]
    size = WIDTHS.get(stem.shape[0])
    if size is None:
        raise CheckpointError(f"an RTMDet stem of width {stem.shape[0]} is no RTMDet size (t, s, m, l, x)")
    state: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if SKIP.search(key):
            continue
        if key.startswith(("backbone.", "neck.")):
            state[key] = value
        elif key.startswith(prefix):
            ours = _head_key(key[len(prefix) :], value, tensors, prefix)
            if ours is not None:
                state["head." + ours] = value
    state[STEM] = stem.flip(1)  # BGR -> RGB input channels
    return Foreign(size, state, int(tensors[prefix + CLS].shape[0]))


def _head_key(key: str, value: torch.Tensor, tensors: dict[str, torch.Tensor], prefix: str) -> str | None:
    """A file's head key -> ours; None for a shared convolution's copy at levels 1, 2 (checked equal to level 0's)."""
    m = TOWER.match(key)
    if m is None:
        return key  # rtm_cls / rtm_reg: the same names
    branch, level, layer, part, rest = m.groups()
    if part == "bn":
        return f"{branch}_norms.{level}.{layer}.{rest}"
    if level != "0":
        first = tensors.get(f"{prefix}{branch}_convs.0.{layer}.conv.{rest}")
        if first is None or not torch.equal(first, value):
            raise CheckpointError(
                f"{prefix}{key} differs from level 0's: an RTMDet head whose levels do not share their convolutions "
                "(share_conv=False) is not built here"
            )
        return None
    return f"{branch}_convs.{layer}.{rest}"


def _write(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    levels = len({k.split(".")[2] for k in state if k.startswith("head.cls_norms.")})
    for key, value in state.items():
        if not key.startswith("head."):
            out[key] = value
            continue
        rest = key[len("head.") :]
        m = re.match(r"^(cls|reg)_norms\.(\d+)\.(\d+)\.(.+)$", rest)
        c = re.match(r"^(cls|reg)_convs\.(\d+)\.(.+)$", rest)
        if m:
            branch, level, layer, name = m.groups()
            out[f"{prefix}{branch}_convs.{level}.{layer}.bn.{name}"] = value
        elif c:
            branch, layer, name = c.groups()
            for level in range(levels):  # a copy each: safetensors refuses tensors that share memory
                out[f"{prefix}{branch}_convs.{level}.{layer}.conv.{name}"] = value.clone()
        else:
            out[prefix + rest] = value
    out[STEM] = state[STEM].flip(1)
    return out


def write_libreyolo16(state: dict[str, torch.Tensor], size: str) -> dict[str, torch.Tensor]:
    return _write(state, "head.")


def write_mmdet(state: dict[str, torch.Tensor], size: str) -> dict[str, torch.Tensor]:
    return _write(state, "bbox_head.")


def _libreyolo16(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    """LibreYOLO 1.6 stamps its checkpoints (.pt: schema_version, model_family "rtmdet"); its .safetensors hold the
    weights alone, which the layout reader below takes."""
    if "schema_version" not in meta or meta.get("model_family") != "rtmdet":
        return None
    got = _convert(tensors, "head.")
    return None if got is None else Foreign.with_meta(got.size, got.state, got.nc, meta)


def _layout16(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    return _convert(tensors, "head.")


def _mmdet(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    return _convert(tensors, "bbox_head.")


CONVERTERS = (
    Converter("LibreYOLO 1.6 RTMDet checkpoint", _libreyolo16, write_libreyolo16),
    Converter("RTMDet weights in LibreYOLO 1.6's layout (its .safetensors)", _layout16, write_libreyolo16),
    Converter("RTMDet weights in mmdetection's layout (a state_dict whose head is bbox_head)", _mmdet, write_mmdet),
)
