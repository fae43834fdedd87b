"""YOLOv9 family spec: GELAN network, auxiliary PGI head while training, TAL/CIoU/DFL loss."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torchvision.ops import batched_nms

from libreyolo.families import Family, register
from libreyolo.families.yolo9.loss import DetectionLoss
from libreyolo.families.yolo9.network import SIZES, TrainNet, YOLO9


def build(size: str, nc: int) -> YOLO9:
    return YOLO9(size, nc)


def train_net(net: YOLO9, cfg: Any) -> TrainNet:
    return TrainNet(net, aux=bool(cfg.aux))


class Yolo9Loss:
    """Main head loss plus aux_weight times the auxiliary head's loss; logged terms are the main head's."""

    def __init__(self, net: YOLO9, cfg: Any, reduce_normalizer: Callable | None = None):
        self.main = DetectionLoss(net.nc, net.strides, net.reg_max, cfg.box, cfg.cls, cfg.dfl, reduce_normalizer=reduce_normalizer)
        self.aux_weight = float(cfg.aux_weight)

    def __call__(self, outputs: tuple[torch.Tensor, ...], targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float):
        if len(outputs) > 1 and self.aux_weight > 0:
            # both heads in one batched loss call: one assignment, half the kernels
            return self.main(torch.cat(outputs[:2], 0), targets, mask, imgsz, batch_scale, (1.0, self.aux_weight))
        return self.main(outputs[0], targets, mask, imgsz, batch_scale)


def loss(net: YOLO9, cfg: Any, reduce_normalizer: Callable | None = None) -> Yolo9Loss:
    return Yolo9Loss(net, cfg, reduce_normalizer)


@torch.no_grad()
def postprocess(net: YOLO9, raw: torch.Tensor, imgsz: tuple[int, int], conf: float = 0.25, iou: float = 0.7, max_det: int = 300, multi_label: bool = False, max_nms: int = 30000) -> list[dict[str, torch.Tensor]]:
    """Raw logits -> per image {boxes (n, 4) xyxy in input pixels, scores (n,), classes (n,)} after NMS."""
    pred = net.head.decode(raw.float(), net.feature_shapes(*imgsz))  # (B, A, 4 + nc)
    out = []
    for p in pred:
        boxes, probs = p[:, :4], p[:, 4:]
        if multi_label:
            i, j = (probs > conf).nonzero(as_tuple=True)
            boxes, scores, classes = boxes[i], probs[i, j], j
        else:
            scores, classes = probs.max(1)
            keep = scores > conf
            boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
        if scores.numel() > max_nms:
            top = scores.topk(max_nms).indices
            boxes, scores, classes = boxes[top], scores[top], classes[top]
        keep = batched_nms(boxes, scores, classes, iou)[:max_det]
        out.append({"boxes": boxes[keep], "scores": scores[keep], "classes": classes[keep]})
    return out


FAMILY = register(
    Family(
        name="yolo9",
        prefix="LibreYOLO9",
        sizes=tuple(SIZES),
        task="detect",
        build=build,
        train_net=train_net,
        loss=loss,
        postprocess=postprocess,
        capture_plan="network",
        supports_full_graph=True,
        supports_ddp=True,
        defaults={"amp": True, "sync_bn": True},
    )
)

__all__ = ["FAMILY", "YOLO9", "TrainNet", "nn"]
