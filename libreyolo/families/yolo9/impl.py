"""YOLOv9's implementation: GELAN network, auxiliary PGI head while training, TAL/CIoU/DFL loss."""

from __future__ import annotations

import torch
from torch import nn

from libreyolo.families import RunKeys
from libreyolo.families.base import FamilyImpl, Reduce, own, random_output
from libreyolo.families.yolo9 import FAMILY
from libreyolo.families.yolo9.loss import DetectionLoss
from libreyolo.families.yolo9.network import YOLO9, TrainNet
from libreyolo.families.yolo9.postprocess import postprocess


def build(size: str, nc: int) -> YOLO9:
    return YOLO9(size, nc)


def train_net(net: nn.Module, cfg: RunKeys) -> TrainNet:
    return TrainNet(own(net, YOLO9), aux=bool(FAMILY.options_of(cfg).aux))


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Random raw outputs of the main (and auxiliary) head: (batch, 4 * reg_max + nc, anchors) each."""
    t = own(train, TrainNet)
    anchors = sum(h * w for h, w in t.net.feature_shapes(*imgsz))
    shape = (batch, 4 * t.net.reg_max + t.net.nc, anchors)
    return tuple(random_output(shape, dtype, device) for _ in range(1 if t.aux is None else 2))


class Yolo9Loss:
    """Main head loss plus aux_weight times the auxiliary head's loss; logged terms are the main head's."""

    def __init__(self, net: YOLO9, cfg: RunKeys, reduce_normalizer: Reduce | None = None):
        k = FAMILY.options_of(cfg)
        self.main = DetectionLoss(
            net.nc, net.strides, net.reg_max, k.box, k.cls, k.dfl, reduce_normalizer=reduce_normalizer
        )
        self.aux_weight = float(k.aux_weight)

    def __call__(
        self,
        outputs: torch.Tensor | tuple[torch.Tensor, ...],
        targets: torch.Tensor,
        mask: torch.Tensor,
        imgsz: tuple[int, int],
        batch_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(outputs, torch.Tensor):  # the detector alone (validation): the main head's output
            outputs = (outputs,)
        if len(outputs) > 1 and self.aux_weight > 0:
            # both heads in one batched loss call: one assignment, half the kernels
            return self.main(torch.cat(outputs[:2], 0), targets, mask, imgsz, batch_scale, (1.0, self.aux_weight))
        return self.main(outputs[0], targets, mask, imgsz, batch_scale)


def loss(net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None) -> Yolo9Loss:
    return Yolo9Loss(own(net, YOLO9), cfg, reduce_normalizer)


IMPL = FamilyImpl(build=build, train_net=train_net, loss=loss, postprocess=postprocess, example_outputs=example_outputs)

__all__ = ["IMPL", "YOLO9", "TrainNet"]
