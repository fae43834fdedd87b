"""Fine-grained distribution refinement (D-FINE, Peng et al. 2024): a box is four edge distances from a reference
box, each predicted as a distribution over reg_max + 1 bins. A bin's value comes from a non-uniform weighting
function W(n): fine steps near zero (small corrections), coarse ones at the ends (up to 2 x up x reg_scale half
box sizes). The distance is the distribution's expectation; the loss (FGL) teaches the two bins around the true
distance, weighted by how close each is."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from libreyolo.families.rtdetr.matcher import cxcywh_to_xyxy


def weighting(reg_max: int, up: float, reg_scale: float, device: torch.device | None = None) -> torch.Tensor:
    """W(n), n = 0..reg_max: (reg_max + 1,) increasing, W(reg_max / 2) = 0, W(0) = -W(reg_max) = -2 up reg_scale;
    between the ends a geometric progression whose last inner step reaches up x reg_scale."""
    bound = torch.tensor(abs(up) * abs(reg_scale), dtype=torch.float32)
    step = (bound + 1) ** (2 / (reg_max - 2))
    inner = torch.stack([step**i - 1 for i in range(1, reg_max // 2)])
    values = torch.cat(((-2 * bound)[None], -inner.flip(0), torch.zeros(1), inner, (2 * bound)[None]))
    return values.to(device)


def expectation(corners: torch.Tensor, project: torch.Tensor) -> torch.Tensor:
    """Edge logits (..., 4 * (R + 1)) -> the four expected distances (..., 4)."""
    prob = corners.unflatten(-1, (4, project.shape[0])).softmax(-1)
    return prob @ project.to(prob.dtype)


def distances_to_boxes(ref: torch.Tensor, dist: torch.Tensor, reg_scale: float) -> torch.Tensor:
    """Reference boxes (..., 4) cx, cy, w, h and distances (..., 4) of the left, top, right and bottom edges, in
    units of the reference's size / reg_scale beyond half of it -> boxes (..., 4) cx, cy, w, h."""
    s = abs(reg_scale)
    reach = (0.5 * s + dist) * torch.cat((ref[..., 2:], ref[..., 2:]), -1) / s  # left, top, right, bottom
    x1, y1 = ref[..., 0] - reach[..., 0], ref[..., 1] - reach[..., 1]
    x2, y2 = ref[..., 0] + reach[..., 2], ref[..., 1] + reach[..., 3]
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)


def boxes_to_bins(
    ref: torch.Tensor, target: torch.Tensor, project: torch.Tensor, reg_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of distances_to_boxes on the bins: reference (P, 4) cx, cy, w, h and target (P, 4) cx, cy, w, h
    -> (the left bin of each edge's true distance (P * 4,) long, the weight of the bin to its right (P * 4,)); a
    distance beyond the ends goes wholly to the end bin."""
    s = abs(reg_scale)
    t = cxcywh_to_xyxy(target)
    wh = ref[:, 2:].repeat(1, 2) / s + 1e-16
    sign = torch.tensor([1.0, 1.0, -1.0, -1.0], device=ref.device)
    dist = ((ref[:, :2].repeat(1, 2) - t) * sign / wh - 0.5 * s).reshape(-1)
    R = project.shape[0] - 1
    left = (project[None] <= dist[:, None]).sum(1) - 1
    i = left.clamp(0, R - 1)
    lo, hi = project[i], project[i + 1]
    right_w = (dist - lo).abs() / ((dist - lo).abs() + (hi - dist).abs())
    right_w = torch.where(
        left < 0, torch.zeros_like(right_w), torch.where(left >= R, torch.ones_like(right_w), right_w)
    )
    return i, right_w


def fgl(corners: torch.Tensor, bins: torch.Tensor, right_w: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Fine-grained localisation loss, summed: corners (P * 4, R + 1) edge logits; the true distance's left bin
    and right weight (boxes_to_bins); weight (P * 4,) (the prediction's IoU with its target)."""
    left = F.cross_entropy(corners, bins, reduction="none") * (1 - right_w)
    right = F.cross_entropy(corners, bins + 1, reduction="none") * right_w
    return ((left + right) * weight).sum()
