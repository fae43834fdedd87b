"""D-FINE's decoder: RT-DETR's query selection and denoising groups, gated decoder layers, and fine-grained
distribution refinement: the first layer's box (`pre_bbox_head`) becomes every later layer's reference, and each
layer predicts the four edge distances from it as distributions over bins (fdr.py), adding its logits to the
previous layer's. A quality head (LQE) adds to each class score a term computed from the sharpness of the edge
distributions (the top-4 probabilities and their mean per edge)."""

from __future__ import annotations

import math

import torch
from torch import nn

from libreyolo.families.dfine.fdr import distances_to_boxes, expectation, weighting
from libreyolo.families.rtdetr.decoder import MLP, PRIOR_PROB, DecoderLayer, init_box_heads_and_queries, select_queries
from libreyolo.families.rtdetr.denoising import DenoisingGroups, inverse_sigmoid


class Quality(nn.Module):
    """LQE: class logits + an MLP of the edge distributions' top-k probabilities and their mean."""

    def __init__(self, reg_max: int, k: int = 4, hidden: int = 64):
        super().__init__()
        self.reg_max, self.k = reg_max, k
        self.reg_conf = MLP(4 * (k + 1), hidden, 1, 2)
        last = self.reg_conf.layers[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, scores: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        prob = corners.unflatten(-1, (4, self.reg_max + 1)).softmax(-1)
        top = prob.topk(self.k, dim=-1).values
        stat = torch.cat((top, top.mean(-1, keepdim=True)), -1).flatten(-2)
        return scores + self.reg_conf(stat)


class DfineDecoder(nn.Module):
    project: torch.Tensor  # W(n), the bins' values

    def __init__(
        self,
        nc: int,
        d: int = 256,
        levels: int = 3,
        layers: int = 3,
        heads: int = 8,
        ffn: int = 1024,
        points: tuple[int, ...] = (3, 6, 3),
        num_queries: int = 300,
        reg_max: int = 32,
        reg_scale: float = 4.0,
        up: float = 0.5,
    ):
        super().__init__()
        self.nc, self.d, self.num_queries = nc, d, num_queries
        self.reg_max, self.reg_scale, self.up = reg_max, reg_scale, up
        self.register_buffer("project", weighting(reg_max, up, reg_scale), persistent=False)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, ffn, levels, points, gated=True) for _ in range(layers))
        self.lqe = nn.ModuleList(Quality(reg_max) for _ in range(layers))
        self.denoising_embed = nn.Embedding(nc + 1, d, padding_idx=nc)
        nn.init.normal_(self.denoising_embed.weight[:-1])
        self.query_pos_head = MLP(4, 2 * d, d, 2)
        self.enc_output = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d))
        self.enc_score_head = nn.Linear(d, nc)
        self.enc_bbox_head = MLP(d, d, 4, 3)
        self.score_heads = nn.ModuleList(nn.Linear(d, nc) for _ in range(layers))
        self.pre_bbox_head = MLP(d, d, 4, 3)
        self.bbox_heads = nn.ModuleList(MLP(d, d, 4 * (reg_max + 1), 3) for _ in range(layers))
        self._reset()

    def _reset(self) -> None:
        bias = -math.log((1 - PRIOR_PROB) / PRIOR_PROB)
        for head in (self.enc_score_head, *self.score_heads):
            nn.init.constant_(head.bias, bias)
        heads = (self.enc_bbox_head, self.pre_bbox_head, *self.bbox_heads)
        init_box_heads_and_queries(heads, self.enc_output, self.query_pos_head)

    def forward(
        self, feats: list[torch.Tensor], dn: DenoisingGroups | None = None
    ) -> dict[str, torch.Tensor] | tuple[torch.Tensor, torch.Tensor]:
        """feats: the encoder's maps (already of the decoder's width). Training -> a dict (see `_training_dict`);
        eval -> (logits (B, Q, nc), boxes (B, Q, 4) normalised cx, cy, w, h) of the last layer."""
        shapes = [(f.shape[2], f.shape[3]) for f in feats]
        memory = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)
        target, ref_unact, enc_logits = select_queries(
            memory, shapes, self.num_queries, self.enc_output, self.enc_score_head, self.enc_bbox_head
        )
        enc_boxes = ref_unact.sigmoid()
        ref_unact = ref_unact.detach()
        attn_mask = None
        if dn is not None:
            target = torch.cat((self.denoising_embed(dn.labels).to(target.dtype), target), 1)
            ref_unact = torch.cat((dn.boxes_unact.to(ref_unact.dtype), ref_unact), 1)
            attn_mask = dn.attn_mask(enc_logits.shape[1])
        layers = self._layers(target, ref_unact.sigmoid(), memory, shapes, attn_mask)
        if not self.training:
            return layers["logits"][-1], layers["boxes"][-1]
        return self._training_dict(layers, enc_logits, enc_boxes, dn.real if dn else 0, dn.size if dn else 0)

    def _layers(
        self,
        x: torch.Tensor,
        ref: torch.Tensor,
        memory: torch.Tensor,
        shapes: list[tuple[int, int]],
        attn_mask: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """The decoder layers from the queries' content x and boxes ref (B, N, 4). Each layer's edge logits are
        its head's output (of its queries plus the previous layer's, detached) added to the previous layer's;
        the boxes are decoded from the first layer's box (`refs`), which stays every layer's reference."""
        last = len(self.layers) - 1
        logits, boxes, corners = [], [], []
        prev_x: torch.Tensor | float = 0.0
        prev_corners: torch.Tensor | float = 0.0
        initial = pre_boxes = pre_logits = ref
        for i, layer in enumerate(self.layers):
            pos = self.query_pos_head(ref).clamp(-10.0, 10.0).to(x.dtype)
            x = layer(x, ref, memory, shapes, attn_mask, pos)
            if i == 0:
                pre_boxes = (self.pre_bbox_head(x) + inverse_sigmoid(ref)).sigmoid()
                pre_logits = self.score_heads[0](x)
                initial = pre_boxes.detach()
            c = self.bbox_heads[i](x + prev_x) + prev_corners
            box = distances_to_boxes(initial, expectation(c, self.project), self.reg_scale)
            if self.training or i == last:
                logits.append(self.lqe[i](self.score_heads[i](x), c))
                boxes.append(box)
                corners.append(c)
            prev_corners, prev_x, ref = c, x.detach(), box.detach()
        return {
            "logits": torch.stack(logits),
            "boxes": torch.stack(boxes),
            "corners": torch.stack(corners),
            "refs": initial,
            "pre_logits": pre_logits,
            "pre_boxes": pre_boxes,
        }

    @staticmethod
    def _training_dict(
        layers: dict[str, torch.Tensor], enc_logits: torch.Tensor, enc_boxes: torch.Tensor, n_dn: int, first: int
    ) -> dict[str, torch.Tensor]:
        """Every layer's logits (L, B, N, nc), boxes (L, B, N, 4) and edge logits (L, B, N, 4 (R + 1)), the shared
        reference boxes `refs` (B, N, 4), the first layer's own box head (`pre_*`) and the encoder's top-k
        (`enc_*`); N is the matching queries (from query `first` on), and the denoising groups' first n_dn queries
        the same under `dn_` (a padded layout's padding, between them, is dropped)."""
        out = {"enc_logits": enc_logits, "enc_boxes": enc_boxes}
        for key, value in layers.items():
            q = value.dim() - 2  # the query dimension (after the layer's in stacked outputs)
            out[key] = value.narrow(q, first, value.shape[q] - first)
            if n_dn:
                out["dn_" + key] = value.narrow(q, 0, n_dn)
        return out
