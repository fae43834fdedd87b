"""RT-DETR's hybrid encoder: every backbone level projected to one width, one transformer layer (AIFI) over the
coarsest level only (self-attention where it is cheap: 400 tokens at 640 px), then CCFM, a PAN-style top-down and
bottom-up fusion of the three levels with CSP blocks of RepVGG-style convolutions. Static shapes, no host
synchronisation: the whole backbone + encoder is what `cuda_graph=true` captures."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class ConvNorm(nn.Sequential):
    """Conv2d (no bias) + BatchNorm (+ SiLU); g: groups."""

    def __init__(self, c1: int, c2: int, k: int, s: int = 1, act: bool = True, g: int = 1):
        super().__init__(
            nn.Conv2d(c1, c2, k, s, (k - 1) // 2, groups=g, bias=False),
            nn.BatchNorm2d(c2),
            nn.SiLU() if act else nn.Identity(),
        )


class RepVgg(nn.Module):
    """A 3x3 and a 1x1 conv-BN branch summed, then SiLU (the training form; not re-parameterised)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = ConvNorm(c, c, 3, act=False)
        self.conv2 = ConvNorm(c, c, 1, act=False)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv1(x) + self.conv2(x))


class CSPRep(nn.Module):
    def __init__(self, c1: int, c2: int, n: int = 3, expansion: float = 1.0):
        super().__init__()
        h = int(c2 * expansion)
        self.conv1, self.conv2 = ConvNorm(c1, h, 1), ConvNorm(c1, h, 1)
        self.blocks = nn.Sequential(*(RepVgg(h) for _ in range(n)))
        self.conv3: nn.Module = ConvNorm(h, c2, 1) if h != c2 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.blocks(self.conv1(x)) + self.conv2(x))


def sincos_2d(
    h: int, w: int, dim: int, device: torch.device, temperature: float = 10000.0, column_major: bool = False
) -> torch.Tensor:
    """(h * w, dim) fixed 2-D sine-cosine position embedding (a quarter of the channels per sin/cos x/y).
    column_major: the positions enumerated column by column while the tokens are row by row, as the official
    RT-DETR / D-FINE code builds it (on a square map a token's first half then encodes its row, not its column);
    weights trained with that embedding need it."""
    q = dim // 4
    omega = 1.0 / temperature ** (torch.arange(q, device=device, dtype=torch.float32) / q)
    ys = torch.arange(h, device=device, dtype=torch.float32)
    xs = torch.arange(w, device=device, dtype=torch.float32)
    if column_major:
        gx, gy = torch.meshgrid(xs, ys, indexing="ij")
    else:
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    ox, oy = gx.reshape(-1, 1) * omega, gy.reshape(-1, 1) * omega
    return torch.cat((ox.sin(), ox.cos(), oy.sin(), oy.cos()), 1)


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer; the position embedding is added to queries and keys only."""

    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = x + pos
        x = self.norm1(x + self.attn(q, q, x, need_weights=False)[0])
        return self.norm2(x + self.linear2(F.gelu(self.linear1(x))))


class HybridEncoder(nn.Module):
    """fuse(hidden) and down(hidden): the fusion block (2 x hidden channels in, hidden out) and the stride-2
    downsampler of CCFM where a family's differ from RT-DETR's (CSP of RepVGG convs; a 3x3 conv); lateral_act: a
    SiLU after the lateral 1x1 convs; column_major: sincos_2d's position layout."""

    def __init__(
        self,
        in_channels: tuple[int, ...],
        hidden: int = 256,
        heads: int = 8,
        ffn: int = 1024,
        expansion: float = 0.5,
        depth: int = 3,
        fuse: Callable[[int], nn.Module] | None = None,
        down: Callable[[int], nn.Module] | None = None,
        lateral_act: bool = True,
        column_major: bool = False,
    ):
        super().__init__()
        self.hidden, self.column_major = hidden, column_major
        self.input_proj = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden)) for c in in_channels
        )
        self.aifi = EncoderLayer(hidden, heads, ffn)
        n = len(in_channels)
        fuse = fuse or (lambda c: CSPRep(2 * c, c, depth, expansion))
        down = down or (lambda c: ConvNorm(c, c, 3, 2))
        self.lateral = nn.ModuleList(ConvNorm(hidden, hidden, 1, act=lateral_act) for _ in range(n - 1))
        self.fpn = nn.ModuleList(fuse(hidden) for _ in range(n - 1))
        self.down = nn.ModuleList(down(hidden) for _ in range(n - 1))
        self.pan = nn.ModuleList(fuse(hidden) for _ in range(n - 1))

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        proj = [p(f) for p, f in zip(self.input_proj, feats)]
        top = proj[-1]
        b, c, h, w = top.shape
        tokens = top.flatten(2).transpose(1, 2)
        tokens = self.aifi(tokens, sincos_2d(h, w, c, top.device, column_major=self.column_major).to(tokens.dtype))
        proj[-1] = tokens.transpose(1, 2).reshape(b, c, h, w).contiguous()
        # top-down: each coarser map, laterally convolved, is upsampled into the next finer one
        inner = [proj[-1]]
        for i, k in enumerate(range(len(proj) - 1, 0, -1)):
            high = self.lateral[i](inner[0])
            inner[0] = high
            up = F.interpolate(high, size=proj[k - 1].shape[-2:], mode="nearest")
            inner.insert(0, self.fpn[i](torch.cat((up, proj[k - 1]), 1)))
        # bottom-up: each finer output, downsampled, joins the next coarser inner map
        outs = [inner[0]]
        for i in range(len(proj) - 1):
            outs.append(self.pan[i](torch.cat((self.down[i](outs[-1]), inner[i + 1]), 1)))
        return outs
