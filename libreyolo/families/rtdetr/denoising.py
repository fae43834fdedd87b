"""Contrastive denoising groups (DN-DETR, DINO; as RT-DETR trains): noised copies of the ground truths join the
decoder's queries, the positive copies learning to reconstruct their box and the negative ones (noised further)
learning "no object". An attention mask keeps the groups from seeing each other and the matching queries from
seeing any of them. Built for the whole batch with tensor ops; the group count follows the most boxes any image
of the batch has, so the query count is data-dependent (the decoder runs eagerly)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from libreyolo.errors import ConfigError


@dataclass
class DenoisingGroups:
    labels: torch.Tensor  # (B, N) class index per denoising query, nc for padding (embedded as "no class")
    boxes_unact: torch.Tensor  # (B, N, 4) inverse sigmoid of the noised cx, cy, w, h
    groups: int  # number of groups
    per_group: int  # G: the most boxes one image has; a group is G positive then G negative queries
    pad: int = 0  # queries after the groups that only keep the count fixed (padded): nothing sees them

    @property
    def size(self) -> int:
        return self.labels.shape[1]

    @property
    def real(self) -> int:
        """The queries of the groups, without the padding."""
        return self.size - self.pad

    def attn_mask(self, num_queries: int) -> torch.Tensor:
        """(N + Q, N + Q) bool, True where attention is not allowed: the matching queries never see the denoising
        ones (those carry the answers), nor a group another group; a padding query sees itself only."""
        n, r, dev = self.size, self.real, self.labels.device
        mask = torch.zeros(n + num_queries, n + num_queries, dtype=torch.bool, device=dev)
        mask[n:, :n] = True
        if r:
            grp = torch.arange(r, device=dev) // (2 * self.per_group)
            mask[:r, :r] = grp[:, None] != grp[None, :]
        mask[:, r:n] = True
        mask[r:n] = True
        mask[torch.arange(r, n, device=dev), torch.arange(r, n, device=dev)] = False
        return mask

    def positive_index(self) -> torch.Tensor:
        """(groups, G) the query index of each ground-truth slot's positive copy, group by group."""
        g = torch.arange(self.groups, device=self.labels.device)[:, None] * 2 * self.per_group
        return g + torch.arange(self.per_group, device=self.labels.device)[None]


def pad_groups(dn: DenoisingGroups | None, size: int, batch: int, nc: int, device: torch.device) -> DenoisingGroups:
    """The groups padded to `size` queries (no groups: all padding), so that the decoder's query count is the same
    for every batch: a padding query has no class, a harmless box, and no query sees it; the loss reads the groups
    only (DenoisingGroups.real). A layout of more than `size` queries is refused."""
    real = dn.size if dn is not None else 0
    if real > size:
        raise ConfigError(
            f"{real} denoising queries do not fit dn_pad={size}: set dn_pad to at least 2 x max(num_denoising, the "
            "most boxes in one image)"
        )
    labels = torch.full((batch, size - real), nc, dtype=torch.long, device=device)
    boxes = torch.zeros(batch, size - real, 4, device=device)  # inverse sigmoid of a centred box of half the image
    if dn is None:
        return DenoisingGroups(labels, boxes, 0, 0, size)
    return DenoisingGroups(
        torch.cat((dn.labels, labels.to(dn.labels.dtype)), 1),
        torch.cat((dn.boxes_unact, boxes.to(dn.boxes_unact.dtype)), 1),
        dn.groups,
        dn.per_group,
        size - real,
    )


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x = x.clamp(0.0, 1.0)
    return torch.log(x.clamp(min=eps) / (1.0 - x).clamp(min=eps))


def build_groups(
    cls: torch.Tensor,
    boxes: torch.Tensor,
    valid: torch.Tensor,
    nc: int,
    num_denoising: int = 100,
    label_noise: float = 0.5,
    box_noise: float = 1.0,
) -> DenoisingGroups | None:
    """cls (B, G) long, boxes (B, G, 4) normalised cx, cy, w, h, valid (B, G) bool: the packed ground truths
    (each image's boxes first, G = the most boxes in an image). None when there is nothing to denoise."""
    B, G = valid.shape
    if G == 0 or num_denoising <= 0:
        return None
    groups = max(num_denoising // G, 1)
    dev = boxes.device
    n = 2 * G * groups
    # (B, groups, 2, G): positive and negative copies of every slot
    pos_neg = torch.arange(2, device=dev).view(1, 1, 2, 1).expand(B, groups, 2, G)
    negative = (pos_neg == 1).reshape(B, n)
    slot_valid = valid[:, None, None, :].expand(B, groups, 2, G).reshape(B, n)
    labels = cls[:, None, None, :].expand(B, groups, 2, G).reshape(B, n).clone()
    known = boxes[:, None, None, :, :].expand(B, groups, 2, G, 4).reshape(B, n, 4)

    if label_noise > 0:
        flip = (torch.rand(B, n, device=dev) < label_noise * 0.5) & slot_valid
        labels = torch.where(flip, torch.randint_like(labels, 0, nc), labels)
    labels = torch.where(slot_valid, labels, torch.full_like(labels, nc))

    if box_noise > 0:
        xyxy = torch.cat((known[..., :2] - known[..., 2:] / 2, known[..., :2] + known[..., 2:] / 2), -1)
        half_wh = (known[..., 2:] * 0.5).repeat(1, 1, 2) * box_noise
        sign = torch.randint_like(known, 0, 2) * 2.0 - 1.0
        # positives move by less than half their size, negatives by between one and two halves
        part = torch.rand_like(known) + negative.unsqueeze(-1).float()
        xyxy = (xyxy + sign * part * half_wh).clamp(0.0, 1.0)
        known = torch.cat(((xyxy[..., :2] + xyxy[..., 2:]) / 2, xyxy[..., 2:] - xyxy[..., :2]), -1)
    boxes_unact = inverse_sigmoid(known)

    return DenoisingGroups(labels, boxes_unact, groups, G)


def pack_targets(
    targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Padded targets (B, M, 5) class, x1, y1, x2, y2 in pixels with mask (B, M) -> (cls (B, G) long, boxes (B,
    G, 4) normalised cx, cy, w, h, valid (B, G), the box count per image), each image's boxes first and G the
    most boxes in one image. Reading the counts is a host synchronisation (one small copy): the denoising
    layout and the matcher both depend on them."""
    B = mask.shape[0]
    counts = [int(c) for c in mask.sum(1).tolist()]
    G = max(counts, default=0)
    order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices[:, :G]
    t = targets.gather(1, order[..., None].expand(-1, -1, 5)).float()
    valid = mask.gather(1, order) if G else mask.new_zeros(B, 0)
    h, w = imgsz
    scale = t.new_tensor([w, h, w, h])
    xyxy = t[..., 1:5] / scale
    boxes = torch.cat(((xyxy[..., :2] + xyxy[..., 2:]) / 2, xyxy[..., 2:] - xyxy[..., :2]), -1)
    boxes = torch.where(valid[..., None], boxes, torch.full_like(boxes, 0.5))  # padding: a harmless box
    return t[..., 0].long().clamp(min=0), boxes, valid, counts
