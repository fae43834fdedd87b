"""RT-DETR weights from other layouts: the official RT-DETR (v1) release files (lyuwenyu/RT-DETR rtdetr_pytorch,
`rtdetr_r*vd_*.pth`) and LibreYOLO 1.6's RT-DETR checkpoints, which keep the official layout (`.pt` with its
class names and image size, `.safetensors` with the weights alone); and torchvision ResNet state dicts as the
backbone (pretrained= only: the rest of the detector starts afresh).

The official network is the same function as this one (its PResNet is the ResNet-vd here, torchvision's block
classes under other names; the hybrid encoder and the decoder compute the same, its position embedding laid out
column by column: HybridEncoder's column_major); only module names differ, so the conversion renames keys.
torchvision's ResNets have the same residual blocks (`layer1..4` are `stages.0..3`), but a 7x7 stem instead of
three 3x3 convolutions and shortcuts without the average pool: the blocks load (a shortcut's conv and BN one
place further in its Sequential, behind the pool: a start, since pooling before the 1x1 conv is not the strided
1x1 conv it was trained as), the stem is not read, and stage 1's first shortcut, a projection here and none in
torchvision's ResNet-18/34, is set to the identity."""

from __future__ import annotations

import re
from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign

PREFIX = "features.backbone.stages."
# (bottleneck blocks, blocks in the third stage) -> the RT-DETR size of that depth
DEPTHS = {(False, 2): "r18", (False, 6): "r34", (True, 6): "r50", (True, 23): "r101"}
BLOCK = re.compile(r"layer([1-4])\.(\d+)\.(.+)")
# official key pieces -> ours, applied in order (the backbone's before the generic conv/norm of a ConvNormLayer)
RENAMES = (
    (r"^backbone\.", "features.backbone."),
    (r"^encoder\.", "features.encoder."),
    (r"\.conv1\.conv1_(\d)\.", lambda m: f".stem.{int(m.group(1)) - 1}."),
    (r"\.res_layers\.(\d+)\.blocks\.", r".stages.\1."),
    (r"\.branch2([abc])\.conv\.", lambda m: f".conv{' abc'.index(m.group(1))}."),
    (r"\.branch2([abc])\.norm\.", lambda m: f".bn{' abc'.index(m.group(1))}."),
    (r"\.short\.(conv\.)?norm\.", ".downsample.2."),  # before the conv's: ".short.conv." starts both
    (r"\.short\.(conv\.)?conv\.", ".downsample.1."),  # behind the pool (stride 2) or an identity (stride 1)
    (r"\.encoder\.0\.layers\.0\.self_attn\.", ".aifi.attn."),
    (r"\.encoder\.0\.layers\.0\.", ".aifi."),
    (r"\.lateral_convs\.", ".lateral."),
    (r"\.downsample_convs\.", ".down."),
    (r"\.fpn_blocks\.", ".fpn."),
    (r"\.pan_blocks\.", ".pan."),
    (r"\.bottlenecks\.", ".blocks."),
    (r"^decoder\.decoder\.layers\.", "decoder.layers."),
    (r"\.denoising_class_embed\.", ".denoising_embed."),
    (r"\.dec_score_head\.", ".score_heads."),
    (r"\.dec_bbox_head\.", ".bbox_heads."),
    (r"\.(conv|proj)\.", ".0."),  # a ConvNormLayer's, an input projection's, RT-DETRv2's enc_output's
    (r"\.norm\.", ".1."),
)
# tensors a file may hold that are computed here: anchors and position embeddings of a fixed eval size
COMPUTED = re.compile(r"num_batches_tracked$|^decoder\.(anchors|valid_mask)$|^encoder\.pos_embed\d+$")


def _official_key(key: str) -> str:
    for pattern, repl in RENAMES:
        key = re.sub(pattern, repl, key)
    return key


def _count(tensors: dict[str, torch.Tensor], prefix: str) -> int:
    return len({k[len(prefix) :].split(".", 1)[0] for k in tensors if k.startswith(prefix)})


def _official_size(tensors: dict[str, torch.Tensor]) -> str:
    """The size an official-layout file holds, or CheckpointError saying why it is none of this project's."""
    from libreyolo.families.rtdetr.network import SIZES  # here: the registry imports this module's names only

    if any("num_points_scale" in k for k in tensors):
        raise CheckpointError("an RT-DETRv2 checkpoint (its decoder samples differently); only RT-DETR v1 is read")
    if "backbone.res_layers.0.blocks.0.branch2a.conv.weight" not in tensors:
        raise CheckpointError("an RT-DETR whose backbone is no ResNet-vd (HGNetv2: sizes l, x); r18-r101 are read")
    bottleneck = "backbone.res_layers.0.blocks.0.branch2c.conv.weight" in tensors
    size = DEPTHS.get((bottleneck, _count(tensors, "backbone.res_layers.2.blocks.")))
    if size is None:
        raise CheckpointError("an RT-DETR whose ResNet-vd is no depth of 18, 34, 50 or 101")
    spec = SIZES[size]
    layers = _count(tensors, "decoder.dec_score_head.")
    width = tensors["encoder.fpn_blocks.0.conv1.conv.weight"].shape[0]
    if layers != spec.dec_layers or width != int(spec.hidden * spec.expansion):
        raise CheckpointError(
            f"an RT-DETR-{size} with {layers} decoder layers and CSP width {width}; this project's {size} has "
            f"{spec.dec_layers} and {int(spec.hidden * spec.expansion)} (the r50m variant is not built here)"
        )
    return size


def _convert(tensors: dict[str, torch.Tensor]) -> Foreign | None:
    if "decoder.dec_score_head.0.weight" not in tensors or "decoder.enc_score_head.weight" not in tensors:
        return None
    size = _official_size(tensors)
    state = {_official_key(k): v for k, v in tensors.items() if not COMPUTED.search(k)}
    return Foreign(size, state, int(tensors["decoder.dec_score_head.0.weight"].shape[0]))


def _libreyolo16(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    """LibreYOLO 1.6 stamps its .pt (schema_version, model_family "rtdetr"); its .safetensors hold the weights
    alone, which the official reader below takes."""
    if "schema_version" not in meta or meta.get("model_family") != "rtdetr":
        return None
    got = _convert(tensors)
    return None if got is None else Foreign.with_meta(got.size, got.state, got.nc, meta)


def _official(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    return _convert(tensors)


def _torchvision_key(key: str) -> str | None:
    m = BLOCK.fullmatch(key)
    if m is None:
        return None  # the 7x7 stem and the classifier
    rest = m.group(3)
    if rest.startswith("downsample."):
        index, tail = rest[len("downsample.") :].split(".", 1)
        rest = f"downsample.{int(index) + 1}.{tail}"  # behind the shortcut's average pool
    return f"{PREFIX}{int(m.group(1)) - 1}.{m.group(2)}.{rest}"


def _identity_shortcut(c: int, eps: float = 1e-5) -> dict[str, torch.Tensor]:
    """Stage 1's first shortcut as the identity torchvision's block has there: a 1x1 convolution of the identity
    matrix and a BatchNorm whose variance + eps is 1."""
    at = f"{PREFIX}0.0.downsample."
    return {
        f"{at}1.weight": torch.eye(c)[:, :, None, None],
        f"{at}2.weight": torch.ones(c),
        f"{at}2.bias": torch.zeros(c),
        f"{at}2.running_mean": torch.zeros(c),
        f"{at}2.running_var": torch.full((c,), 1.0 - eps),
    }


def _torchvision(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    if "conv1.weight" not in tensors or "layer1.0.conv1.weight" not in tensors:
        return None
    blocks = len({k.split(".")[1] for k in tensors if k.startswith("layer3.")})
    size = DEPTHS.get(("layer1.0.conv3.weight" in tensors, blocks))
    if size is None:
        return None
    state = {ours: v for k, v in tensors.items() if (ours := _torchvision_key(k)) is not None}
    if "layer1.0.downsample.0.weight" not in tensors:
        state.update(_identity_shortcut(tensors["layer1.0.conv1.weight"].shape[1]))
    return Foreign(size, state, 0, partial=True)


CONVERTERS = (
    Converter("LibreYOLO 1.6 RT-DETR checkpoint", _libreyolo16),
    Converter(
        "RT-DETR weights in the official layout (lyuwenyu rtdetr_r*vd_*.pth, LibreYOLO 1.6 .safetensors)", _official
    ),
    Converter("torchvision ResNet state dict as RT-DETR's backbone (pretrained= only)", _torchvision),
)
