"""RT-DETR's decoder: encoder memory -> query selection (the top-k encoder tokens by class score become the
initial queries and reference boxes) -> decoder layers (self-attention, multi-scale deformable cross-attention,
FFN), each refining the reference boxes; denoising queries ride along in training."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from libreyolo.families.rtdetr.attention import MSDeformableAttention
from libreyolo.families.rtdetr.denoising import DenoisingGroups, inverse_sigmoid

PRIOR_PROB = 0.01  # the class heads start out predicting "nothing here"


class MLP(nn.Module):
    def __init__(self, c_in: int, hidden: int, c_out: int, n: int):
        super().__init__()
        dims = [c_in] + [hidden] * (n - 1) + [c_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


class Gate(nn.Module):
    """D-FINE's gated fusion: sigmoid gates (starting at one half each) weigh the queries and the
    cross-attention's output per channel before the norm, where RT-DETR adds them."""

    def __init__(self, d: int):
        super().__init__()
        self.gate = nn.Linear(2 * d, 2 * d)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        g1, g2 = self.gate(torch.cat((x, y), -1)).sigmoid().chunk(2, -1)
        return self.norm(g1 * x + g2 * y)


class DecoderLayer(nn.Module):
    """gated: D-FINE's layer: a Gate instead of the residual sum and norm after the cross-attention (which then
    samples the memory without value and output projections), and the FFN's sum clamped to float16's largest
    finite value before the last norm."""

    def __init__(self, d: int, heads: int, ffn: int, levels: int, points: int | tuple[int, ...], gated: bool = False):
        super().__init__()
        self.gated = gated
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.cross_attn = MSDeformableAttention(d, heads, levels, points, project=not gated)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.norm2: nn.Module = Gate(d) if gated else nn.LayerNorm(d)
        if gated:
            nn.init.xavier_uniform_(self.linear1.weight)
            nn.init.xavier_uniform_(self.linear2.weight)

    def forward(
        self,
        tgt: torch.Tensor,
        ref: torch.Tensor,
        memory: torch.Tensor,
        shapes: list[tuple[int, int]],
        attn_mask: torch.Tensor | None,
        pos: torch.Tensor,
    ) -> torch.Tensor:
        q = tgt + pos
        tgt = self.norm1(tgt + self.self_attn(q, q, tgt, attn_mask=attn_mask, need_weights=False)[0])
        cross = self.cross_attn(tgt + pos, ref, memory, shapes)
        tgt = self.norm2(tgt, cross) if self.gated else self.norm2(tgt + cross)
        tgt = tgt + self.linear2(F.relu(self.linear1(tgt)))
        return self.norm3(tgt.clamp(-65504.0, 65504.0) if self.gated else tgt)


def init_box_heads_and_queries(box_heads: tuple[MLP, ...], enc_output: nn.Sequential, query_pos_head: MLP) -> None:
    """The box refinements start at zero (boxes = their references); the encoder's output projection and the query
    position head get Xavier-uniform weights (RT-DETR's and D-FINE's initialisation)."""
    for mlp in box_heads:
        last = mlp.layers[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    enc_linear = enc_output[0]
    assert isinstance(enc_linear, nn.Linear)
    nn.init.xavier_uniform_(enc_linear.weight)
    for lin in query_pos_head.layers:
        assert isinstance(lin, nn.Linear)
        nn.init.xavier_uniform_(lin.weight)


def make_anchors(
    shapes: list[tuple[int, int]], device: torch.device, base: float = 0.05, eps: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (anchors (S, 4) as inverse-sigmoid cx, cy, w, h; valid (S, 1)): a box per feature cell, its side
    doubling per level; cells whose anchor touches the border are invalid (their logits would be infinite)."""
    out = []
    for lvl, (h, w) in enumerate(shapes):
        gy, gx = torch.meshgrid(
            torch.arange(h, device=device, dtype=torch.float32),
            torch.arange(w, device=device, dtype=torch.float32),
            indexing="ij",
        )
        xy = torch.stack(((gx + 0.5) / w, (gy + 0.5) / h), -1).reshape(-1, 2)
        out.append(torch.cat((xy, torch.full_like(xy, base * 2.0**lvl)), -1))
    a = torch.cat(out)
    valid = ((a > eps) & (a < 1 - eps)).all(-1, keepdim=True)
    anchors = torch.log(a / (1 - a))
    return torch.where(valid, anchors, torch.full_like(anchors, float("inf"))), valid


def select_queries(
    memory: torch.Tensor,
    shapes: list[tuple[int, int]],
    num_queries: int,
    enc_output: nn.Module,
    score_head: nn.Module,
    bbox_head: nn.Module,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query selection: the encoder tokens (memory (B, S, d)) with the best class score become the queries. ->
    (their content (B, k, d), detached; their boxes (B, k, 4) as inverse-sigmoid cx, cy, w, h: the box head's
    refinement of each token's anchor; their class logits (B, k, nc)). k = min(num_queries, S): a small input
    has fewer tokens than queries, and then all of them are queries."""
    anchors, valid = make_anchors(shapes, memory.device)
    out_mem = enc_output(memory * valid.to(memory.dtype))
    logits = score_head(out_mem)
    idx = logits.detach().max(-1).values.topk(min(num_queries, memory.shape[1]), dim=1).indices
    top = out_mem.gather(1, idx[..., None].expand(-1, -1, out_mem.shape[-1]))
    ref_unact = bbox_head(top) + anchors[idx]
    return top.detach(), ref_unact, logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1]))


class Decoder(nn.Module):
    def __init__(
        self,
        nc: int,
        d: int = 256,
        levels: int = 3,
        layers: int = 3,
        heads: int = 8,
        ffn: int = 1024,
        points: int = 4,
        num_queries: int = 300,
        feat: int | None = None,
    ):
        super().__init__()
        self.nc, self.d, self.num_queries = nc, d, num_queries
        c = feat or d  # the encoder's width (RT-DETR-r101's 384 is projected to the decoder's 256)
        self.input_proj = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, d, 1, bias=False), nn.BatchNorm2d(d)) for _ in range(levels)
        )
        self.denoising_embed = nn.Embedding(nc + 1, d, padding_idx=nc)
        self.enc_output = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d))
        self.enc_score_head = nn.Linear(d, nc)
        self.enc_bbox_head = MLP(d, d, 4, 3)
        self.query_pos_head = MLP(4, 2 * d, d, 2)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, ffn, levels, points) for _ in range(layers))
        self.score_heads = nn.ModuleList(nn.Linear(d, nc) for _ in range(layers))
        self.bbox_heads = nn.ModuleList(MLP(d, d, 4, 3) for _ in range(layers))
        self._reset()

    def _reset(self) -> None:
        bias = -math.log((1 - PRIOR_PROB) / PRIOR_PROB)
        for head in (self.enc_score_head, *self.score_heads):
            nn.init.constant_(head.bias, bias)
        init_box_heads_and_queries((self.enc_bbox_head, *self.bbox_heads), self.enc_output, self.query_pos_head)

    def forward(
        self, feats: list[torch.Tensor], dn: DenoisingGroups | None = None
    ) -> dict[str, torch.Tensor] | tuple[torch.Tensor, torch.Tensor]:
        """feats: the encoder's maps. Training -> a dict of every layer's (L, B, N, .) logits and boxes, the
        encoder's top-k output and the denoising queries' outputs; eval -> (logits (B, Q, nc), boxes (B, Q, 4)
        normalised cx, cy, w, h) of the last layer."""
        shapes = [(f.shape[2], f.shape[3]) for f in feats]
        memory = torch.cat([p(f).flatten(2).transpose(1, 2) for p, f in zip(self.input_proj, feats)], 1)
        target, ref_unact, enc_logits = select_queries(
            memory, shapes, self.num_queries, self.enc_output, self.enc_score_head, self.enc_bbox_head
        )
        k = target.shape[1]
        attn_mask = None
        if dn is not None:
            target = torch.cat((self.denoising_embed(dn.labels).to(target.dtype), target), 1)
            ref_unact = torch.cat((dn.boxes_unact.to(ref_unact.dtype), ref_unact), 1)
            attn_mask = dn.attn_mask(k)
        ref = ref_unact.detach().sigmoid()
        last = len(self.layers) - 1
        logits, boxes = [], []
        prev = ref
        x = target
        for i, layer in enumerate(self.layers):
            x = layer(x, ref, memory, shapes, attn_mask, self.query_pos_head(ref.to(x.dtype)).to(x.dtype))
            delta = self.bbox_heads[i](x)
            refined = (delta + inverse_sigmoid(ref)).sigmoid()
            if self.training or i == last:
                logits.append(self.score_heads[i](x))
                # the box loss of layer i also trains layer i-1's refinement (RT-DETR's look-forward-twice)
                boxes.append(refined if i == 0 else (delta + inverse_sigmoid(prev)).sigmoid())
            prev = refined
            ref = refined.detach()
        if not self.training:
            return logits[-1], boxes[-1]
        n_dn = dn.size if dn is not None else 0
        L, B = torch.stack(logits), torch.stack(boxes)
        out = {
            "logits": L[:, :, n_dn:],
            "boxes": B[:, :, n_dn:],
            "enc_logits": enc_logits,
            "enc_boxes": ref_unact[:, n_dn:].sigmoid(),
        }
        if dn is not None:
            out["dn_logits"], out["dn_boxes"] = L[:, :, :n_dn], B[:, :, :n_dn]
        return out
