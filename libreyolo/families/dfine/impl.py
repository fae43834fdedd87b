"""D-FINE's implementation: network, loss (Hungarian matching on the host), RT-DETR's postprocess and parameter
groups (the backbone at backbone_lr x lr0)."""

from __future__ import annotations

from torch import nn

from libreyolo.families import RunKeys
from libreyolo.families.base import FamilyImpl, Reduce, own
from libreyolo.families.dfine import FAMILY
from libreyolo.families.dfine.loss import DFINELoss
from libreyolo.families.dfine.network import DFINE
from libreyolo.families.rtdetr.impl import accumulation_scale, configure, param_groups
from libreyolo.families.rtdetr.postprocess import postprocess


def build(size: str, nc: int) -> DFINE:
    return DFINE(size, nc)


def train_net(net: nn.Module, cfg: RunKeys) -> nn.Module:
    """The detector itself, with the run's query, denoising and backbone-LR keys set on it."""
    k = FAMILY.options_of(cfg)
    net = configure(own(net, DFINE), k)
    net.dn_pad = int(k.dn_pad)
    return net


def loss(net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None) -> DFINELoss:
    net, k = own(net, DFINE), FAMILY.options_of(cfg)
    dec = net.decoder
    gains = (k.vfl, k.bbox, k.giou, k.fgl, k.ddf)
    return DFINELoss(net.nc, dec.project, dec.reg_scale, gains, accumulation_scale(cfg), reduce_normalizer)


IMPL = FamilyImpl(build=build, train_net=train_net, loss=loss, postprocess=postprocess, param_groups=param_groups)

__all__ = ["DFINE", "DFINELoss", "IMPL"]
