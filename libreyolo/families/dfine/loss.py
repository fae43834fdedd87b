"""D-FINE's loss: RT-DETR's varifocal, L1 and GIoU terms plus the fine-grained localisation loss (FGL) on every
decoder layer's edge distributions and the decoupled distillation (DDF, GO-LSD's self-distillation) of each
earlier layer's distributions towards the last layer's.

Matching: every prediction set (the decoder layers, the first layer's own box head `pre`, the encoder's top-k) is
matched by RT-DETR's Hungarian matcher in one batch. The classification term uses each set's own matches; the box
and localisation terms use their union (global optimal, "GO"): each query matched by any set takes the ground
truth that most sets gave it, so that every layer learns the same boxes. The denoising queries' targets are known
(no matching), as in RT-DETR."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from libreyolo.families.dfine.fdr import boxes_to_bins, fgl
from libreyolo.families.rtdetr.denoising import pack_targets
from libreyolo.families.rtdetr.loss import aligned_iou, box_terms, prediction_sets, varifocal
from libreyolo.families.rtdetr.matcher import cxcywh_to_xyxy, hungarian, match_costs

Index = tuple[torch.Tensor, ...]
TEMPERATURE = 5.0  # of the distillation's softened distributions


def _iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of matching rows of cx, cy, w, h boxes (..., 4), detached: the targets of the classification and the
    weights of the localisation terms."""
    return aligned_iou(cxcywh_to_xyxy(a.detach()).reshape(-1, 4), cxcywh_to_xyxy(b).reshape(-1, 4)).view(a.shape[:-1])


class DFINELoss:
    """Call with the network's output and padded targets; returns (loss for backward, detached [vfl, bbox, giou,
    fgl, ddf] before their gains)."""

    capturable = False  # the matching copies costs to the host: a validation graph holds the network only

    def __init__(
        self,
        nc: int,
        project: torch.Tensor,
        reg_scale: float,
        gains: tuple[float, float, float, float, float] = (1.0, 5.0, 2.0, 0.15, 1.5),
        scale: float = 1.0,
        reduce_normalizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.nc, self.project, self.reg_scale, self.gains = nc, project, reg_scale, gains
        self.alpha, self.gamma = 0.75, 2.0
        self.scale = scale  # 1 / gradient accumulation steps: the clip norm applies to a mean gradient
        self.reduce_normalizer = reduce_normalizer

    def _norm(self, count: torch.Tensor) -> torch.Tensor:
        count = count.float()
        return self.reduce_normalizer(count) if self.reduce_normalizer is not None else count.clamp(min=1.0)

    def __call__(
        self, outputs: Any, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int], batch_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cls, tboxes, valid, counts = pack_targets(targets, mask, imgsz)
        n = self._norm(valid.sum())
        if not isinstance(outputs, dict):  # validation: the last layer's (logits, boxes); no distributions
            logits, boxes = prediction_sets(outputs)
            s, b, q, g = hungarian(match_costs(logits, boxes, cls, tboxes), counts)
            t_cls, t_box = cls[b, g], tboxes[b, g]
            iou = _iou(boxes[s, b, q], t_box)
            vfl = varifocal(logits, (s, b, q), t_cls, iou, torch.ones_like(iou), self.alpha, self.gamma)
            zero = vfl.new_zeros(())
            items = torch.stack((vfl, *box_terms(boxes[s, b, q], t_box, torch.ones_like(iou)), zero, zero)) / n
            return self._total(items), items.detach()
        items = self._matched(outputs, cls, tboxes, counts, n)
        if "dn_logits" in outputs:
            items = items + self._denoising(outputs, cls, tboxes, valid, n)
        return self._total(items), items.detach()

    def _total(self, items: torch.Tensor) -> torch.Tensor:
        return (items * items.new_tensor(self.gains)).sum() * self.scale

    def _matched(
        self, out: dict[str, torch.Tensor], cls: torch.Tensor, tboxes: torch.Tensor, counts: list[int], n: torch.Tensor
    ) -> torch.Tensor:
        L = out["logits"].shape[0]
        logits = torch.cat((out["logits"], out["pre_logits"][None], out["enc_logits"][None])).float()
        boxes = torch.cat((out["boxes"], out["pre_boxes"][None], out["enc_boxes"][None])).float()
        s, b, q, g = hungarian(match_costs(logits, boxes, cls, tboxes), counts)
        iou = _iou(boxes[s, b, q], tboxes[b, g])
        vfl = varifocal(logits, (s, b, q), cls[b, g], iou, torch.ones_like(iou), self.alpha, self.gamma)
        # the union of the sets' matches: each matched query takes the ground truth most sets gave it
        B, Q, G = boxes.shape[1], boxes.shape[2], tboxes.shape[1]
        votes = boxes.new_zeros(B, Q, max(G, 1)).index_put_((b, q, g), torch.ones_like(iou), accumulate=True)
        most, best = votes.max(-1)
        gb, gq = (most > 0).nonzero(as_tuple=True)
        t_go = tboxes[gb, best[gb, gq]]
        n_go = self._norm(torch.tensor(len(gb), device=n.device))
        S = boxes.shape[0]
        src = boxes[:, gb, gq]  # (S, P, 4)
        l1, giou = box_terms(src.flatten(0, 1), t_go.repeat(S, 1), src.new_ones(S * len(gb)))
        layer_iou = _iou(src[:L], t_go.expand(L, -1, -1))  # (L, P)
        local = self._fgl(out["corners"][:, gb, gq], out["refs"][gb, gq], t_go, layer_iou)
        positive = torch.zeros(B, Q, dtype=torch.bool, device=boxes.device)
        positive[gb, gq] = True
        self._pos_neg = (positive.sum() * 4 * 8 / B).sqrt(), ((~positive).sum() * 4 * 8 / B).sqrt()
        ddf = self._ddf(out["corners"], out["logits"][-1], (gb, gq), layer_iou)
        return torch.stack((vfl / n, l1 / n_go, giou / n_go, local / n_go, ddf))

    def _denoising(
        self,
        out: dict[str, torch.Tensor],
        cls: torch.Tensor,
        tboxes: torch.Tensor,
        valid: torch.Tensor,
        n: torch.Tensor,
    ) -> torch.Tensor:
        """The denoising queries' terms: each group's positive copies against their own ground truths (padding
        slots weighted 0), normalised by the box count times the group count, as RT-DETR's."""
        logits = torch.cat((out["dn_logits"], out["dn_pre_logits"][None])).float()
        boxes = torch.cat((out["dn_boxes"], out["dn_pre_boxes"][None])).float()
        S, B, N, _ = logits.shape
        G = valid.shape[1]
        groups = N // (2 * G)
        dev = logits.device
        b_i = torch.arange(B, device=dev).view(B, 1, 1).expand(B, groups, G).flatten()
        j_i = torch.arange(G, device=dev).view(1, 1, G).expand(B, groups, G).flatten()
        q_i = (torch.arange(groups, device=dev).view(1, groups, 1) * 2 * G + torch.arange(G, device=dev)).expand(
            B, groups, G
        )
        q_i = q_i.flatten()
        w = valid[b_i, j_i].float()
        t_cls, t_box = cls[b_i, j_i], tboxes[b_i, j_i]
        src = boxes[:, b_i, q_i]  # (S, P, 4)
        iou = _iou(src, t_box.expand(S, -1, -1))
        s_i = torch.arange(S, device=dev).view(S, 1).expand(S, len(b_i)).flatten()
        at = (s_i, b_i.repeat(S), q_i.repeat(S))
        vfl = varifocal(logits, at, t_cls.repeat(S), iou.flatten(), w.repeat(S), self.alpha, self.gamma)
        l1, giou = box_terms(src.flatten(0, 1), t_box.repeat(S, 1), w.repeat(S))
        L = S - 1
        local = self._fgl(out["dn_corners"][:, b_i, q_i], out["dn_refs"][b_i, q_i], t_box, iou[:L] * w)
        ddf = self._ddf(out["dn_corners"], out["dn_logits"][-1], (b_i, q_i), iou[:L], w > 0)
        nd = n * groups
        return torch.stack((vfl / nd, l1 / nd, giou / nd, local / nd, ddf))

    def _fgl(self, corners: torch.Tensor, refs: torch.Tensor, t_box: torch.Tensor, iou: torch.Tensor) -> torch.Tensor:
        """FGL summed over the layers: corners (L, P, 4 (R + 1)) of the matched queries, their reference boxes
        refs (P, 4), targets t_box (P, 4), each layer's IoU weights (L, P)."""
        self.project = self.project.to(refs.device)
        bins, right_w = boxes_to_bins(refs.detach().float(), t_box, self.project, self.reg_scale)
        R1 = self.project.shape[0]
        return sum(
            (fgl(c.reshape(-1, R1).float(), bins, right_w, w.repeat_interleave(4)) for c, w in zip(corners, iou)),
            corners.new_zeros(()),
        )

    def _ddf(
        self,
        corners: torch.Tensor,
        teacher_logits: torch.Tensor,
        idx: Index,
        iou: torch.Tensor,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decoupled distillation, summed over the layers before the last: KL from each layer's edge distributions
        (L, B, N, 4 (R + 1)) to the last layer's (the teacher, detached), softened by TEMPERATURE, each query
        weighted by the teacher's confidence (its best class probability), or for the matched queries idx by the
        layer's IoU with its target; the matched and the other queries averaged apart and mixed by the square
        roots of their counts (the matching queries' counts, also for the denoising ones)."""
        L, B, N, E = corners.shape
        R1 = self.project.shape[0]
        if keep is not None:
            idx, iou = tuple(i[keep] for i in idx), iou[:, keep]
        teacher = corners[-1].detach().reshape(-1, R1).float()
        target = F.softmax(teacher / TEMPERATURE, -1)
        matched = torch.zeros(B, N, dtype=torch.bool, device=corners.device)
        matched[idx] = True
        matched = matched[..., None].expand(B, N, 4).reshape(-1)
        num_pos, num_neg = self._pos_neg
        total = corners.new_zeros((), dtype=torch.float32)
        for layer in range(L - 1):
            weight = teacher_logits.detach().float().sigmoid().max(-1).values
            weight = weight.index_put(idx, iou[layer].to(weight.dtype))[..., None].expand(B, N, 4).reshape(-1)
            log_p = F.log_softmax(corners[layer].reshape(-1, R1).float() / TEMPERATURE, -1)
            kl = weight * TEMPERATURE**2 * F.kl_div(log_p, target, reduction="none").sum(-1)
            pos = kl[matched].mean() if bool(matched.any()) else kl.new_zeros(())
            neg = kl[~matched].mean() if bool((~matched).any()) else kl.new_zeros(())
            total = total + (pos * num_pos + neg * num_neg) / (num_pos + num_neg)
        return total
