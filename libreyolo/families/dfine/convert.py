"""D-FINE checkpoints of the official release (Peterande/D-FINE, dfine_hgnetv2_{n,s,m}_coco.pth: its EMA weights
are read first) and of LibreYOLO 1.6 (.pt and .safetensors), which keeps the official layout: renamed into this
family's layout by the rules below. The backbone's names are the official ones; the encoder's and decoder's follow
RT-DETR's modules here. Tensors the official network keeps but this one recomputes (the anchors, the points' scales,
`up` and `reg_scale`: checked to be the values this network uses) are dropped."""

from __future__ import annotations

import re
from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign

# (pattern, replacement), applied in order to every official name
RULES: tuple[tuple[str, str], ...] = (
    (r"^backbone\.", "features.backbone."),
    (r"^encoder\.encoder\.0\.layers\.0\.self_attn\.", "features.encoder.aifi.attn."),
    (r"^encoder\.encoder\.0\.layers\.0\.", "features.encoder.aifi."),
    (r"^encoder\.lateral_convs\.", "features.encoder.lateral."),
    (r"^encoder\.fpn_blocks\.", "features.encoder.fpn."),
    (r"^encoder\.pan_blocks\.", "features.encoder.pan."),
    (r"^encoder\.downsample_convs\.(\d+)\.0\.cv1\.", r"features.encoder.down.\1.0."),
    (r"^encoder\.downsample_convs\.(\d+)\.0\.cv2\.", r"features.encoder.down.\1.1."),
    (r"^encoder\.", "features.encoder."),
    (r"\.bottlenecks\.", ".blocks."),
    (r"^(features\.encoder\..*)\.conv\.", r"\1.0."),  # ConvNorm is a Sequential: conv, norm, act
    (r"^(features\.encoder\..*)\.norm\.", r"\1.1."),
    (r"^decoder\.decoder\.layers\.(\d+)\.gateway\.", r"decoder.layers.\1.norm2."),
    (r"^decoder\.decoder\.layers\.", "decoder.layers."),
    (r"^decoder\.decoder\.lqe_layers\.", "decoder.lqe."),
    (r"^decoder\.denoising_class_embed\.", "decoder.denoising_embed."),
    (r"^decoder\.enc_output\.proj\.", "decoder.enc_output.0."),
    (r"^decoder\.enc_output\.norm\.", "decoder.enc_output.1."),
    (r"^decoder\.dec_score_head\.", "decoder.score_heads."),
    (r"^decoder\.dec_bbox_head\.", "decoder.bbox_heads."),
)
RECOMPUTED = re.compile(r"(^decoder\.(decoder\.)?(up|reg_scale|anchors|valid_mask)$)|num_points_scale$")
FIXED = {"up": 0.5, "reg_scale": 4.0}  # the weighting function's settings of D-FINE n, s and m
# (encoder width, encoder levels, the first level's input channels) -> size
SIZES = {(128, 2, 512): "n", (256, 3, 256): "s", (256, 3, 384): "m"}


def ours(key: str) -> str:
    for pattern, repl in RULES:
        key = re.sub(pattern, repl, key)
    return key


def _size(tensors: dict[str, torch.Tensor]) -> str:
    hidden = tensors["encoder.lateral_convs.0.conv.weight"].shape[0]
    levels = sum(1 for k in tensors if re.fullmatch(r"encoder\.input_proj\.\d+\.conv\.weight", k))
    first = tensors["encoder.input_proj.0.conv.weight"].shape[1]
    size = SIZES.get((hidden, levels, first))
    if size is None:
        raise CheckpointError(
            f"a D-FINE checkpoint of encoder width {hidden}, {levels} levels and {first} backbone channels is not one "
            "of the sizes built here (n, s, m; the official l and x use HGNetv2 B4/B5 and are not)"
        )
    return size


def _convert(tensors: dict[str, torch.Tensor]) -> Foreign | None:
    if "decoder.pre_bbox_head.layers.0.weight" not in tensors or "encoder.lateral_convs.0.conv.weight" not in tensors:
        return None
    if any(k.startswith(("decoder.mask_", "encoder.DeFE.")) for k in tensors):
        raise CheckpointError("a D-FINE checkpoint with a mask head or DeFE (D-FINE-seg, Dome-DETR): not built here")
    size = _size(tensors)
    for name, value in FIXED.items():
        got = tensors.get(f"decoder.{name}")
        if got is not None and abs(float(got.flatten()[0]) - value) > 1e-6:
            raise CheckpointError(
                f"this D-FINE checkpoint's {name} is {float(got.flatten()[0])}; D-FINE {size} uses {value}"
            )
    state = {ours(k): v for k, v in tensors.items() if not RECOMPUTED.search(k)}
    return Foreign(size, state, int(tensors["decoder.dec_score_head.0.bias"].shape[0]))


def _libreyolo16(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    """LibreYOLO 1.6 stamps its checkpoints (.pt: schema_version, model_family "dfine"); its .safetensors hold the
    weights alone, which the official reader below takes."""
    if "schema_version" not in meta or meta.get("model_family") != "dfine":
        return None
    got = _convert(tensors)
    return None if got is None else Foreign.with_meta(got.size, got.state, got.nc, meta)


def _official(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    return _convert(tensors)


CONVERTERS = (
    Converter("LibreYOLO 1.6 D-FINE checkpoint", _libreyolo16),
    Converter(
        "D-FINE weights in the official layout (dfine_hgnetv2_*_coco.pth, LibreYOLO 1.6 .safetensors)", _official
    ),
)
