"""Multi-scale deformable attention (Deformable DETR) written with `grid_sample`: every query samples a few points
per head and level around its reference box and mixes them with learned weights. No custom CUDA op, so it runs
(and is differentiable) wherever torch is."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MSDeformableAttention(nn.Module):
    """points: per query, head and level (one count for every level, or one per level: D-FINE's 3, 6, 3);
    project: value and output projections (D-FINE's attention samples the encoder memory as it is)."""

    def __init__(
        self, d: int = 256, heads: int = 8, levels: int = 3, points: int | tuple[int, ...] = 4, project: bool = True
    ):
        super().__init__()
        self.points = tuple(points) if isinstance(points, tuple) else (points,) * levels
        self.d, self.heads, self.levels = d, heads, levels
        total = sum(self.points)
        self.sampling_offsets = nn.Linear(d, heads * total * 2)
        self.attention_weights = nn.Linear(d, heads * total)
        self.value_proj: nn.Module = nn.Linear(d, d) if project else nn.Identity()
        self.output_proj: nn.Module = nn.Linear(d, d) if project else nn.Identity()
        # a level's offsets are divided by its point count
        scale = torch.cat([torch.full((p,), 1.0 / p) for p in self.points])
        self.register_buffer("point_scale", scale[:, None], persistent=False)
        self._reset()

    def _reset(self) -> None:
        # offsets start as a star of directions, one per head, growing with the point index: the heads look
        # around the reference box in different directions from the first step
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(self.heads, dtype=torch.float32) * (2.0 * math.pi / self.heads)
        grid = torch.stack((theta.cos(), theta.sin()), -1)
        grid = grid / grid.abs().max(-1, keepdim=True).values
        steps = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.points])
        grid = grid.view(self.heads, 1, 2) * steps.view(1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            if isinstance(lin, nn.Linear):
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)

    def forward(
        self, query: torch.Tensor, ref: torch.Tensor, value: torch.Tensor, shapes: list[tuple[int, int]]
    ) -> torch.Tensor:
        """query (B, Q, d); ref (B, Q, 4) normalised cx, cy, w, h; value (B, S, d), the levels' maps flattened
        one after another with (h, w) in `shapes`. -> (B, Q, d)."""
        B, Q, _ = query.shape
        H, P, hd = self.heads, sum(self.points), self.d // self.heads
        v = self.value_proj(value).view(B, -1, H, hd)
        off = self.sampling_offsets(query).view(B, Q, H, P, 2)
        w = self.attention_weights(query).view(B, Q, H, P).softmax(-1)
        r = ref[:, :, None, None, :]
        # offsets are in units of half the reference box, spread over the level's points
        loc = r[..., :2] + off * self.point_scale.to(off.dtype) * r[..., 2:] * 0.5  # (B, Q, H, P, 2)
        grid = (2.0 * loc - 1.0).permute(0, 2, 1, 3, 4).flatten(0, 1)  # (B * H, Q, P, 2)
        sampled = []
        start = 0
        for g, (h, wd) in zip(grid.split(self.points, dim=2), shapes):
            vl = v[:, start : start + h * wd].permute(0, 2, 3, 1).reshape(B * H, hd, h, wd)
            start += h * wd
            sampled.append(
                F.grid_sample(vl, g.to(vl.dtype), mode="bilinear", padding_mode="zeros", align_corners=False)
            )
        s = torch.cat(sampled, -1)  # (B * H, hd, Q, P)
        w = w.permute(0, 2, 1, 3).reshape(B * H, 1, Q, P).to(s.dtype)
        out = (s * w).sum(-1).view(B, H * hd, Q).transpose(1, 2)
        return self.output_proj(out)
