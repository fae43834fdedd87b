"""What is traced: the network alone (its raw outputs, post-processed outside the graph), or with nms=true the
network, the family's decode and an NMS made of traceable ops (torchvision's batched NMS), returning the packed
detections every family's postprocess returns."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families.base import BoxesScores

IMAGE_KEY = 1 << 31  # orders kept boxes by image, then NMS rank: any rank is below it


def graph_nms(boxes: torch.Tensor, scores: torch.Tensor, conf: float, iou: float, max_det: int) -> torch.Tensor:
    """boxes (B, A, 4) xyxy, scores (B, A, C) -> packed (N, 7): image, x1, y1, x2, y2, score, class; grouped by
    image, best first, at most max_det per image. nn/nms.py's nms_packed with multi_label false (each anchor's best
    class above conf, greedy NMS per image and class), less its candidate cap (max_nms), in ops that export."""
    import torchvision

    A, C = scores.shape[1], scores.shape[2]
    score, cls = scores.max(2)
    cand = (score > conf).flatten().nonzero()[:, 0]
    img = cand // A
    s, c, bx = score.flatten()[cand], cls.flatten()[cand], boxes.flatten(0, 1)[cand]
    keep = torchvision.ops.batched_nms(bx, s, img * C + c, iou)  # best first over the whole batch
    rank = torch.ones_like(keep).cumsum(0) - 1
    keep = keep[torch.argsort(img[keep] * IMAGE_KEY + rank)]
    ki = img[keep]
    onehot = (ki[:, None] == torch.arange(scores.shape[0], device=ki.device)[None]).long()
    within = (onehot.cumsum(0) * onehot).sum(1) - 1  # each box's rank within its image
    keep = keep[within < max_det]
    return torch.cat((img[keep, None].float(), bx[keep], s[keep, None], c[keep, None].float()), 1)


class NmsGraph(nn.Module):
    """The network, the family's decode and graph_nms: input (B, 3, H, W) -> packed detections (N, 7)."""

    def __init__(self, net: nn.Module, boxes_scores: BoxesScores, conf: float, iou: float, max_det: int):
        super().__init__()
        self.net, self.boxes_scores = net, boxes_scores
        self.conf, self.iou, self.max_det = conf, iou, max_det

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        boxes, scores = self.boxes_scores(self.net, self.net(x), (x.shape[2], x.shape[3]))
        return graph_nms(boxes.float(), scores.float(), self.conf, self.iou, self.max_det)


def as_list(out: Any) -> list[torch.Tensor]:
    """A network's outputs (a tensor, or a tuple or list of them) as a list."""
    return [out] if isinstance(out, torch.Tensor) else list(out)
