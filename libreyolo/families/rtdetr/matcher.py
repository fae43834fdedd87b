"""Hungarian matching of queries to ground truths. The cost matrices of every prediction set (decoder layers and
the encoder's top-k) and every image are built in one batch on the device and copied to the host once per step;
scipy's linear_sum_assignment then solves each image of each set on the host."""

from __future__ import annotations

import numpy as np
import torch


def cxcywh_to_xyxy(b: torch.Tensor) -> torch.Tensor:
    return torch.cat((b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2), -1)


def pairwise_giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (..., N, 4), b (..., M, 4) xyxy -> (..., N, M) generalized IoU (torchvision's is 2-D only)."""
    a, b = a[..., :, None, :], b[..., None, :, :]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    wh = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a + area_b - inter
    iou = inter / union.clamp(min=1e-9)
    hull = (torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])).clamp(min=0)
    hull_area = hull[..., 0] * hull[..., 1]
    return iou - (hull_area - union) / hull_area.clamp(min=1e-9)


@torch.no_grad()
def match_costs(
    logits: torch.Tensor,
    boxes: torch.Tensor,
    cls: torch.Tensor,
    tboxes: torch.Tensor,
    w_cls: float = 2.0,
    w_bbox: float = 5.0,
    w_giou: float = 2.0,
    alpha: float = 0.25,
    gamma: float = 2.0,
) -> torch.Tensor:
    """logits (S, B, Q, C), boxes (S, B, Q, 4) normalised cx, cy, w, h; cls (B, G), tboxes (B, G, 4) -> the cost
    (S, B, Q, G): focal-style class cost + L1 + generalized IoU, as DETR matchers with sigmoid classifiers use."""
    S, B, Q, _ = logits.shape
    G = cls.shape[1]
    p = logits.float().sigmoid().gather(3, cls[None, :, None, :].expand(S, B, Q, G))
    pos = alpha * (1 - p) ** gamma * -(p + 1e-8).log()
    neg = (1 - alpha) * p**gamma * -(1 - p + 1e-8).log()
    boxes = boxes.float()
    l1 = torch.cdist(boxes.flatten(0, 1), tboxes[None].expand(S, B, G, 4).flatten(0, 1), p=1).view(S, B, Q, G)
    giou = pairwise_giou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(tboxes)[None])
    return w_cls * (pos - neg) + w_bbox * l1 - w_giou * giou


def hungarian(cost: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, ...]:
    """cost (S, B, Q, G) with image b's ground truths in its first counts[b] columns -> (set, image, query,
    ground truth) index tensors of every matched pair, on the cost's device."""
    # imported here: scipy.optimize costs ~0.6 s, which the registry (loaded by every CLI command and the
    # console's form) should not pay
    from scipy.optimize import linear_sum_assignment

    c = cost.cpu().numpy()  # the one device-to-host copy of the step's matching
    out: list[list[np.ndarray]] = [[], [], [], []]
    for s in range(c.shape[0]):
        for b, n in enumerate(counts):
            if n == 0:
                continue
            q, g = linear_sum_assignment(c[s, b, :, :n])
            out[0].append(np.full(len(q), s))
            out[1].append(np.full(len(q), b))
            out[2].append(q)
            out[3].append(g)
    flat = np.stack([np.concatenate(o) if o else np.zeros(0, dtype=np.int64) for o in out]).astype(np.int64)
    idx = torch.from_numpy(flat).to(cost.device, non_blocking=True)  # one host-to-device copy back
    return tuple(idx)
