"""RTMDet's implementation: network, dynamic-soft-label loss, postprocess."""

from __future__ import annotations

import torch
from torch import nn

from libreyolo.families import RunKeys
from libreyolo.families.base import FamilyImpl, Reduce, own, random_output
from libreyolo.families.rtmdet import FAMILY
from libreyolo.families.rtmdet.loss import RTMDetLoss
from libreyolo.families.rtmdet.network import RTMDet
from libreyolo.families.rtmdet.postprocess import postprocess


def build(size: str, nc: int) -> RTMDet:
    return RTMDet(size, nc)


def train_net(net: nn.Module, cfg: RunKeys) -> nn.Module:
    return net  # no training-only heads: the step runs the detector itself


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> torch.Tensor:
    """Random raw head outputs: (batch, anchors, 4 + nc), float32 as the head returns them (the distances are
    positive: the assigner's IoUs need real boxes)."""
    net = own(train, RTMDet)
    anchors = sum(h * w for h, w in net.feature_shapes(*imgsz))
    return random_output((batch, anchors, 4 + net.nc), torch.float32, device, unit=True)


def loss(net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None) -> RTMDetLoss:
    net, k = own(net, RTMDet), FAMILY.options_of(cfg)
    # the loss is a mean; gradients of accumulated micro-batches add up: scale each by 1 / accumulation so that the
    # optimizer steps on the mean over the nominal batch, as RTMDet's (one step per batch of 256 on 8 GPUs)
    nbs, batch = cfg.nbs, cfg.batch
    acc = max(round(nbs / batch), 1) if isinstance(nbs, int) and isinstance(batch, int) and batch > 0 else 1
    return RTMDetLoss(net.nc, net.strides, k.qfl, k.box, scale=1.0 / acc, reduce_normalizer=reduce_normalizer)


IMPL = FamilyImpl(
    build=build,
    train_net=train_net,
    loss=loss,
    postprocess=postprocess,
    example_outputs=example_outputs,
)

__all__ = ["IMPL", "RTMDet", "RTMDetLoss"]
