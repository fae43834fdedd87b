"""The D-FINE detector: HGNetv2 + RT-DETR's hybrid encoder with D-FINE's blocks (`features`, what
`cuda_graph=true` captures) and the FDR decoder; the targets reach the decoder's denoising groups as RT-DETR's
do (rtdetr/network.py's QueryDetector)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from libreyolo.families.dfine.backbone import Arch, HGNetv2
from libreyolo.families.dfine.decoder import DfineDecoder
from libreyolo.families.dfine.neck import elan, scdown
from libreyolo.families.rtdetr.encoder import HybridEncoder
from libreyolo.families.rtdetr.network import QueryDetector


@dataclass(frozen=True)
class Spec:
    arch: str | Arch = "B0"  # HGNetv2 size
    returns: tuple[int, ...] = (1, 2, 3)  # the backbone stages the encoder reads (strides 8, 16, 32)
    hidden: int = 256
    enc_ffn: int = 1024
    expansion: float = 0.5
    depth: float = 0.34
    dec_layers: int = 3
    dec_ffn: int = 1024
    points: tuple[int, ...] = (3, 6, 3)  # sampling points per level in the decoder's cross-attention
    heads: int = 8
    num_queries: int = 300


# the official D-FINE configs (Peng et al. 2024, "D-FINE: Redefine Regression Task in DETRs as Fine-grained
# Distribution Refinement", configs/dfine/dfine_hgnetv2_{n,s,m}_coco.yml)
SIZES: dict[str, Spec] = {
    "n": Spec(returns=(2, 3), hidden=128, enc_ffn=512, expansion=0.34, depth=0.5, dec_ffn=512, points=(6, 6)),
    "s": Spec(),
    "m": Spec(arch="B2", expansion=1.0, depth=0.67, dec_layers=4),
}


class Features(nn.Module):
    """Backbone + encoder: one image tensor in, the fused maps out (the captured part)."""

    def __init__(self, spec: Spec):
        super().__init__()
        self.backbone = HGNetv2(spec.arch, spec.returns)
        self.encoder = HybridEncoder(
            self.backbone.out_channels,
            spec.hidden,
            spec.heads,
            spec.enc_ffn,
            fuse=partial(elan, expansion=spec.expansion, depth=spec.depth),
            down=scdown,
            lateral_act=False,
            column_major=True,
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.encoder(self.backbone(x)))


class DFINE(QueryDetector):
    features: Features
    decoder: DfineDecoder

    def __init__(self, size: str, nc: int, spec: Spec | None = None):
        spec = spec or SIZES[size]
        features = Features(spec)
        levels = len(spec.returns)
        decoder = DfineDecoder(
            nc, spec.hidden, levels, spec.dec_layers, spec.heads, spec.dec_ffn, spec.points, spec.num_queries
        )
        super().__init__(nc, features, decoder, features.backbone.strides)
        self.spec = spec
        self.backbone_lr = 0.5  # D-FINE's recipe trains its backbone at half the LR
