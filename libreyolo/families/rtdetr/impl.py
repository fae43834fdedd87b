"""RT-DETR's implementation: network, loss (Hungarian matching on the host), postprocess, its parameter groups
(the backbone at backbone_lr x lr0)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo.families import RunKeys
from libreyolo.families.base import FamilyImpl, Reduce, own, random_output
from libreyolo.families.rtdetr import FAMILY
from libreyolo.families.rtdetr.loss import RTDETRLoss
from libreyolo.families.rtdetr.network import RTDETR, QueryDetector
from libreyolo.families.rtdetr.postprocess import postprocess


def build(size: str, nc: int) -> RTDETR:
    return RTDETR(size, nc)


def train_net(net: nn.Module, cfg: RunKeys) -> nn.Module:
    """The detector itself; the run's query and denoising settings are set on it (its EMA copy, made after this,
    and its validations follow)."""
    return configure(own(net, RTDETR), FAMILY.options_of(cfg))


def configure(net: QueryDetector, k: Any) -> QueryDetector:
    """Set a run's query, denoising and backbone-LR keys (a family's typed keys, k) on a DETR-style detector."""
    decoder: Any = net.decoder  # RT-DETR's or D-FINE's
    decoder.num_queries = int(k.num_queries)
    net.num_denoising = int(k.num_denoising)
    net.label_noise = float(k.label_noise)
    net.box_noise = float(k.box_noise)
    net.backbone_lr = float(k.backbone_lr)  # read by param_groups, which sees only the net
    return net


def example_outputs(
    train: nn.Module, batch: int, imgsz: tuple[int, int], dtype: torch.dtype, device: torch.device, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Random training outputs for a batch with this target mask: every decoder layer's logits and boxes for the
    selected queries (as many as the encoder has tokens, at most num_queries), the encoder's top-k, and the denoising
    queries' (2 x the most boxes in an image x the group count, denoising.build_groups). Logits in `dtype` (the
    decoder's heads run under autocast), boxes float32 and in (0, 1): the matcher's IoU needs real boxes."""
    net = own(train, RTDETR)
    tokens = sum(h * w for h, w in net.feature_shapes(*imgsz))
    q, layers, nc = min(net.decoder.num_queries, tokens), len(net.decoder.layers), net.nc
    most = int(mask.sum(1).max()) if mask.numel() else 0
    out = {
        "logits": random_output((layers, batch, q, nc), dtype, device),
        "boxes": random_output((layers, batch, q, 4), torch.float32, device, unit=True),
        "enc_logits": random_output((batch, q, nc), dtype, device),
        "enc_boxes": random_output((batch, q, 4), torch.float32, device, unit=True),
    }
    if most and net.num_denoising > 0:
        n_dn = 2 * most * max(net.num_denoising // most, 1)
        out["dn_logits"] = random_output((layers, batch, n_dn, nc), dtype, device)
        out["dn_boxes"] = random_output((layers, batch, n_dn, 4), torch.float32, device, unit=True)
    return out


def loss(net: nn.Module, cfg: RunKeys, reduce_normalizer: Reduce | None = None) -> RTDETRLoss:
    net, k = own(net, RTDETR), FAMILY.options_of(cfg)
    return RTDETRLoss(net.nc, k.vfl, k.bbox, k.giou, scale=accumulation_scale(cfg), reduce_normalizer=reduce_normalizer)


def accumulation_scale(cfg: RunKeys) -> float:
    """Gradients of accumulated micro-batches add up: each is scaled by 1 / accumulation so that the clip norm
    applies to a mean gradient, as in the DETRs' single-step batches."""
    nbs, batch = cfg.nbs, cfg.batch
    acc = max(round(nbs / batch), 1) if isinstance(nbs, int) and isinstance(batch, int) and batch > 0 else 1
    return 1.0 / acc


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    """Biases and norm weights without decay, other weights with it (the engine's default split), each split once
    more into backbone (at backbone_lr x lr0: `lr_scale`) and the rest."""
    net = own(model, QueryDetector)
    backbone = {id(p) for p in net.features.get_submodule("backbone").parameters()}
    groups: dict[tuple[str, bool], list[nn.Parameter]] = {}
    for module in net.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            norm = isinstance(module, (nn.modules.batchnorm._NormBase, nn.LayerNorm))
            kind = "bias" if name == "bias" else "norm" if norm else "weight"
            groups.setdefault((kind, id(p) in backbone), []).append(p)
    return [
        {"params": ps, "decay": kind == "weight", "bias": kind == "bias", "lr_scale": net.backbone_lr if bb else 1.0}
        for (kind, bb), ps in groups.items()
    ]


IMPL = FamilyImpl(
    build=build,
    train_net=train_net,
    loss=loss,
    postprocess=postprocess,
    param_groups=param_groups,
    example_outputs=example_outputs,
)

__all__ = ["IMPL", "RTDETR", "RTDETRLoss", "param_groups"]
