"""The RT-DETR detector: ResNet-vd backbone + hybrid encoder (`features`, what `cuda_graph=true` captures) and
the query-selection decoder. In training the step hands the network the batch's targets before its forward
(`set_targets`) so that the decoder can add the denoising groups."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libreyolo.families.rtdetr.backbone import ResNetVd
from libreyolo.families.rtdetr.decoder import Decoder
from libreyolo.families.rtdetr.denoising import build_groups, pack_targets, pad_groups
from libreyolo.families.rtdetr.encoder import HybridEncoder


@dataclass(frozen=True)
class Spec:
    depths: tuple[int, ...] = (2, 2, 2, 2)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    hidden: int = 256
    heads: int = 8
    enc_ffn: int = 1024
    expansion: float = 0.5  # CCFM's CSP width ratio (RT-DETR-r18: 0.5)
    csp_depth: int = 3
    dec_layers: int = 3
    dec_ffn: int = 1024
    points: int = 4
    num_queries: int = 300
    bottleneck: bool = False  # ResNet-50/101: bottleneck blocks
    dec_hidden: int | None = None  # the decoder's width where it differs from the encoder's (r101)


# the official RT-DETR configs (Lv et al. 2023, "DETRs Beat YOLOs on Real-time Object Detection", and its
# rtdetr_r{18,34,50,101}vd configs): depths, encoder width and CSP expansion, decoder layers
SIZES: dict[str, Spec] = {
    "r18": Spec(),
    "r34": Spec(depths=(3, 4, 6, 3), dec_layers=4),
    "r50": Spec(depths=(3, 4, 6, 3), bottleneck=True, expansion=1.0, dec_layers=6),
    "r101": Spec(
        depths=(3, 4, 23, 3), bottleneck=True, expansion=1.0, dec_layers=6, hidden=384, enc_ffn=2048, dec_hidden=256
    ),
}


class Features(nn.Module):
    """Backbone + encoder: one image tensor in, the three fused maps out (the captured part)."""

    def __init__(self, spec: Spec):
        super().__init__()
        self.backbone = ResNetVd(spec.depths, spec.widths, spec.bottleneck)
        # column_major: the official position layout, which RT-DETR's published weights were trained with
        self.encoder = HybridEncoder(
            self.backbone.out_channels,
            spec.hidden,
            spec.heads,
            spec.enc_ffn,
            spec.expansion,
            spec.csp_depth,
            column_major=True,
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.encoder(self.backbone(x)))


class QueryDetector(nn.Module):
    """What RT-DETR and D-FINE share: `features` (backbone + encoder) giving maps of the given strides, and a
    decoder that takes the denoising groups made from the targets handed over before a training forward."""

    def __init__(self, nc: int, features: nn.Module, decoder: nn.Module, strides: tuple[int, ...]):
        super().__init__()
        self.nc = nc
        self.features, self.decoder = features, decoder
        # denoising settings (the family's keys set them for a run: train_net)
        self.num_denoising, self.label_noise, self.box_noise = 100, 0.5, 1.0
        self.backbone_lr = 0.1  # the backbone's LR as a fraction of lr0 (its param groups' lr_scale)
        self.dn_pad = 0  # > 0: the denoising queries padded to this count (a static layout; D-FINE's dn_pad key)
        self.strides = strides  # of the encoder's maps
        self._targets: tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | None = None

    def feature_shapes(self, h: int, w: int) -> list[tuple[int, int]]:
        """The encoder's map sizes for an input of h x w: every stride-2 layer rounds up (padded convolutions,
        ceil-mode pooling), so any size works."""
        return [(-(-h // s), -(-w // s)) for s in self.strides]

    def set_targets(self, targets: torch.Tensor, mask: torch.Tensor, imgsz: tuple[int, int]) -> None:
        """The next training forward's targets (B, M, 5) and mask (B, M): its denoising groups come from them.
        Used once, then forgotten, so a forward without targets (a probe, validation) adds no groups."""
        self._targets = (targets, mask, imgsz)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor] | tuple[torch.Tensor, torch.Tensor]:
        feats = self.features(x)
        dn = None
        if self.training and self._targets is not None:
            cls, boxes, valid, _ = pack_targets(*self._targets)
            dn = build_groups(cls, boxes, valid, self.nc, self.num_denoising, self.label_noise, self.box_noise)
            if self.dn_pad:
                dn = pad_groups(dn, self.dn_pad, x.shape[0], self.nc, x.device)
        self._targets = None
        out: dict[str, torch.Tensor] | tuple[torch.Tensor, torch.Tensor] = self.decoder(list(feats), dn)
        return out


class RTDETR(QueryDetector):
    features: Features
    decoder: Decoder

    def __init__(self, size: str, nc: int, spec: Spec | None = None):
        spec = spec or SIZES[size]
        d = spec.dec_hidden or spec.hidden
        decoder = Decoder(
            nc, d, 3, spec.dec_layers, spec.heads, spec.dec_ffn, spec.points, spec.num_queries, spec.hidden
        )
        super().__init__(nc, Features(spec), decoder, (8, 16, 32))
        self.spec = spec
