"""RT-DETR family spec: ResNet-vd backbone + hybrid encoder + query-selection decoder with deformable attention and
contrastive denoising; Hungarian matching on the host, so `cuda_graph=true` captures the backbone and encoder
only and the whole step is never captured."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libreyolo import keys as K
from libreyolo.families import CapturePlan, Family, Reduce, families, own, random_output, register
from libreyolo.families.rtdetr.loss import RTDETRLoss
from libreyolo.families.rtdetr.network import RTDETR, SIZES
from libreyolo.families.rtdetr.postprocess import postprocess

NAME = "rtdetr"
LOSS_TERMS = ("vfl", "bbox", "giou")
WHY_NOT_FULL = (
    "RT-DETR's Hungarian matching runs on the host (scipy) and its denoising queries change shape with the boxes "
    "per image, so its whole step cannot be one graph"
)

KEYS = (
    K.Key("num_queries", 300, K.positive(K.integer), "decoder queries (top-k encoder tokens) per image"),
    K.Key("num_denoising", 100, K.nonneg(K.integer), "denoising queries per image in training (0: none)"),
    K.Key("label_noise", 0.5, K.nonneg(K.number), "denoising: a copy's class is random with probability label_noise/2"),
    K.Key("box_noise", 1.0, K.nonneg(K.number), "denoising: box noise scale (in half box sizes)"),
    K.Key("vfl", 1.0, K.nonneg(K.number), "varifocal classification loss gain"),
    K.Key("bbox", 5.0, K.nonneg(K.number), "L1 box loss gain (normalised cx, cy, w, h)"),
    K.Key("giou", 2.0, K.nonneg(K.number), "generalized IoU box loss gain"),
    K.Key("backbone_lr", 0.1, K.nonneg(K.number), "the backbone's learning rate as a fraction of lr0"),
)

# RT-DETR's recipe where it differs from the shared defaults: AdamW at 1e-4 (backbone x0.1: backbone_lr), weight
# decay 1e-4, gradient norm clipped to 0.1, EMA 0.9999 over 2000 warm-up updates, a linear LR warm-up, then a flat
# LR (lrf=1: its 6x schedule never reaches its step). No mosaic (its pipeline has none); the shared random
# scale/translate/flip/HSV stand in for its zoom-out, IoU crop, flip and photometric distortion. nbs=16 is its
# total batch: a smaller batch accumulates to it, a larger one steps every batch.
DEFAULTS: dict[str, Any] = {
    "optimizer": "AdamW",
    "lr0": 1e-4,
    "lrf": 1.0,
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "grad_clip": 0.1,
    "ema": True,
    "ema_decay": 0.9999,
    "ema_tau": 2000.0,
    "warmup_epochs": 1.0,
    "warmup_bias_lr": 0.0,
    "warmup_momentum": 0.9,
    "nbs": 16,
    "mosaic": 0.0,
    "scale": 0.5,
    "translate": 0.1,
    "amp": True,
}


def build(size: str, nc: int) -> RTDETR:
    return RTDETR(size, nc)


def _cfg_value(cfg: Any, name: str) -> Any:
    """A config built for another family (`model.val()` builds one without the model's family) has none of
    these keys: use their defaults then. (A family registered as a variant of this one shares its keys.)"""
    key = next(k for k in KEYS if k.name == name)
    fam = families().get(getattr(cfg, "family", None) or "")
    return getattr(cfg, name) if fam is not None and key in fam.keys else key.default


def train_net(net: nn.Module, cfg: Any) -> nn.Module:
    """The detector itself; the run's query and denoising settings are set on it (its EMA copy, made after this,
    and its validations follow)."""
    net = own(net, RTDETR)
    net.decoder.num_queries = int(_cfg_value(cfg, "num_queries"))
    net.num_denoising = int(_cfg_value(cfg, "num_denoising"))
    net.label_noise = float(_cfg_value(cfg, "label_noise"))
    net.box_noise = float(_cfg_value(cfg, "box_noise"))
    net.backbone_lr = float(_cfg_value(cfg, "backbone_lr"))  # read by param_groups, which sees only the net
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


def loss(net: nn.Module, cfg: Any, reduce_normalizer: Reduce | None = None) -> RTDETRLoss:
    net = own(net, RTDETR)
    g = {n: float(_cfg_value(cfg, n)) for n in ("vfl", "bbox", "giou")}
    # gradients of accumulated micro-batches add up: scale each by 1 / accumulation so that the clip norm (0.1)
    # applies to a mean gradient, as in RT-DETR's single-step batches
    nbs, batch = getattr(cfg, "nbs", 16), getattr(cfg, "batch", 16)
    acc = max(round(nbs / batch), 1) if isinstance(nbs, int) and isinstance(batch, int) and batch > 0 else 1
    return RTDETRLoss(net.nc, g["vfl"], g["bbox"], g["giou"], scale=1.0 / acc, reduce_normalizer=reduce_normalizer)


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    """Biases and norm weights without decay, other weights with it (the engine's default split), each split once
    more into backbone (at backbone_lr x lr0: `lr_scale`) and the rest."""
    net = own(model, RTDETR)
    backbone = {id(p) for p in net.features.backbone.parameters()}
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


FAMILY = register(
    Family(
        name=NAME,
        prefix="LibreRTDETR",
        sizes=tuple(SIZES),
        task="detect",
        build=build,
        train_net=train_net,
        loss=loss,
        postprocess=postprocess,
        loss_terms=LOSS_TERMS,
        keys=KEYS,
        # the decoder's query count (denoising groups) changes per batch and the matching runs on the host: only
        # the backbone + encoder (`features`) are captured
        capture=CapturePlan(("features",), full_step=False, why_not_full=WHY_NOT_FULL),
        supports_ddp=False,
        defaults=DEFAULTS,
        param_groups=param_groups,
        example_outputs=example_outputs,
    )
)

__all__ = ["FAMILY", "RTDETR", "RTDETRLoss"]
