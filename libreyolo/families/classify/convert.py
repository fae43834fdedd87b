"""torchvision ResNet state dicts (resnet18/34/50, e.g. saved by `torch.save(model.state_dict(), path)` or
torchvision's published IMAGENET1K files) and LibreYOLO 1.6's ResNet checkpoints (the same names) as this family's
classifiers: the network here is torchvision's own, under `body.`, so the weights load as they are. Both were
trained on inputs normalised by ImageNet's mean and standard deviation, which this project's classifiers do not
apply (they take RGB in 0..1): the weights are a start for fine-tuning, not the same classifier of the same image."""

from __future__ import annotations

from typing import Any

import torch

from libreyolo.errors import CheckpointError
from libreyolo.families.base import Converter, Foreign

DEPTHS = {(False, 2): "18", (False, 6): "34", (True, 6): "50"}  # (bottleneck blocks, blocks in layer3) -> size


def resnet_size(tensors: dict[str, torch.Tensor]) -> str | None:
    """The torchvision ResNet depth a state dict holds, None if it is not one."""
    if "conv1.weight" not in tensors or "layer1.0.conv1.weight" not in tensors:
        return None
    blocks = len({k.split(".")[1] for k in tensors if k.startswith("layer3.")})
    size = DEPTHS.get(("layer1.0.conv3.weight" in tensors, blocks))
    if size is None:
        raise CheckpointError(f"a torchvision ResNet with {blocks} blocks in layer3 is none of ResNet-18/34/50")
    return size


def read(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    size = resnet_size(tensors)
    if size is None or "fc.weight" not in tensors:
        return None
    state = {"body." + k: v for k, v in tensors.items()}
    return Foreign(size, state, int(tensors["fc.weight"].shape[0]))


def read_libreyolo16(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Foreign | None:
    """LibreYOLO 1.6's ResNet .pt: torchvision's names under "model", with its class names and image size."""
    if "schema_version" not in meta or meta.get("model_family") != "resnet":
        return None
    got = read(tensors, meta)
    if got is None:
        return None
    return Foreign.with_meta(got.size, got.state, got.nc, meta)


def write(state: dict[str, torch.Tensor], size: str) -> dict[str, torch.Tensor]:
    return {k[len("body.") :]: v for k, v in state.items()}


CONVERTERS = (
    Converter("LibreYOLO 1.6 ResNet checkpoint", read_libreyolo16, write),
    Converter("torchvision ResNet state dict", read, write),
)
